// Package unixuser resolves the user an exec runs as (the forms of
// sandbox.ValidUser) in the passwd and group files of a root directory:
// the session's own, read by the agent inside it, or the host's, read by
// the host runner. os/user cannot do it: it reads the process's own /etc
// (or asks libc), never another root's. It also checks the ids against the
// process's user namespace, where an id it does not map cannot be taken.
package unixuser

import (
	"bufio"
	"cmp"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"

	"github.com/tai42/sandbox"
)

// User is an exec's user, resolved.
type User struct {
	UID, GID uint32
	// Groups are the supplementary groups; none when empty.
	Groups []uint32
	// Home is the home directory: the passwd entry's, or "/" without one.
	Home string
}

// Credential is u as the credential a process is started with.
func (u User) Credential() *syscall.Credential {
	return &syscall.Credential{Uid: u.UID, Gid: u.GID, Groups: slices.Clone(u.Groups)}
}

// maxLine bounds a line of a passwd or group file.
const maxLine = 1 << 20

// Files, relative to the root.
const (
	passwdFile = "etc/passwd"
	groupFile  = "etc/group"
)

// Lookup resolves spec, a user of sandbox.ValidUser's forms other than "",
// in root's etc/passwd and etc/group, as sandbox.ValidUser documents: a
// name with its passwd entry's ids and home and every group listing it; a
// uid with its passwd entry's gid, groups and home when it has one, else
// gid 0, no groups and home "/"; uid:gid with exactly those ids, no groups,
// and the uid's home or "/". Malformed lines of either file are passed
// over, and the first entry that matches wins, as libc does; a missing
// group file means no supplementary groups.
//
// Errors: a *sandbox.UserNotFoundError for a name with no passwd entry (a
// missing passwd file included); any other error (a malformed spec, a file
// that cannot be read) says what failed, for the caller to wrap.
func Lookup(root, spec string) (User, error) {
	if spec == "" {
		return User{}, errors.New("no user given")
	}
	if err := sandbox.ValidUser(spec); err != nil {
		return User{}, err
	}
	r := dir(root)
	uidPart, gidPart, pair := strings.Cut(spec, ":")
	uid, numeric := parseID(uidPart)
	var e entry
	var found bool
	err := scan(r, passwdFile, func(fields []string) bool {
		if len(fields) < 4 || fields[0] == "" {
			return false
		}
		id, ok := parseID(fields[2])
		gid, gok := parseID(fields[3])
		if !ok || !gok || (numeric && id != uid) || (!numeric && fields[0] != spec) {
			return false
		}
		e, found = entry{name: fields[0], uid: id, gid: gid}, true
		if len(fields) > 5 && fields[5] != "" {
			e.home = fields[5]
		}
		return true
	})
	if err != nil {
		return User{}, err
	}
	switch {
	case !found && !numeric:
		return User{}, &sandbox.UserNotFoundError{User: spec}
	case !found:
		e = entry{uid: uid}
	}
	u := User{UID: e.uid, GID: e.gid, Home: cmp.Or(e.home, "/")}
	if pair {
		u.GID, _ = parseID(gidPart)
		return u, nil
	}
	if e.name != "" {
		if u.Groups, err = groupsOf(r, e.name); err != nil {
			return User{}, err
		}
	}
	return u, nil
}

// entry is one passwd entry.
type entry struct {
	name     string
	uid, gid uint32
	home     string
}

// groupsOf lists the gids of every group that lists name as a member, in
// file order, each once.
func groupsOf(r dir, name string) ([]uint32, error) {
	var out []uint32
	err := scan(r, groupFile, func(fields []string) bool {
		if len(fields) < 4 || fields[0] == "" {
			return false
		}
		gid, ok := parseID(fields[2])
		if !ok || slices.Contains(out, gid) {
			return false
		}
		for m := range strings.SplitSeq(fields[3], ",") {
			if strings.TrimSpace(m) == name {
				out = append(out, gid)
				break
			}
		}
		return false // every line counts
	})
	return out, err
}

// dir is the root directory the files are read under. Paths resolve as
// this process sees them: the root is "/" for every caller but tests.
type dir string

// scan calls match on the ':'-separated fields of every line of file in r
// that is not blank or a comment, until match returns true. A missing
// file has no lines.
func scan(r dir, file string, match func(fields []string) bool) error {
	f, err := os.Open(filepath.Join(string(r), file))
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("cannot read /%s: %w", file, err)
	}
	defer f.Close()
	return scanLines(f, "/"+file, match)
}

func scanLines(rd io.Reader, name string, match func(fields []string) bool) error {
	sc := bufio.NewScanner(rd)
	sc.Buffer(make([]byte, 0, 4096), maxLine)
	for sc.Scan() {
		line := strings.TrimSuffix(sc.Text(), "\r")
		if strings.TrimSpace(line) == "" || line[0] == '#' || line[0] == '+' || line[0] == '-' {
			continue // blank, a comment, or a NIS entry, which names nobody here
		}
		if match(strings.Split(line, ":")) {
			return nil
		}
	}
	if err := sc.Err(); err != nil {
		if errors.Is(err, bufio.ErrTooLong) {
			return fmt.Errorf("cannot read %s: a line is longer than %d bytes", name, maxLine)
		}
		return fmt.Errorf("cannot read %s: %w", name, err)
	}
	return nil
}

// parseID parses a decimal id of at most sandbox.MaxID.
func parseID(s string) (uint32, bool) {
	if s == "" || s[0] < '0' || s[0] > '9' { // ParseUint would take "+1"
		return 0, false
	}
	n, err := strconv.ParseUint(s, 10, 32)
	if err != nil || n > sandbox.MaxID {
		return 0, false
	}
	return uint32(n), true
}

// CheckMapped reports the first id of u (its uid, gid or a supplementary
// group) that the user namespace of this process does not map: a process
// cannot take it (setuid fails with EINVAL). Outside any user namespace
// every id is mapped.
func CheckMapped(u User) error {
	return checkMapped(u, "/proc/self/uid_map", "/proc/self/gid_map")
}

func checkMapped(u User, uidMap, gidMap string) error {
	ranges := func(file string) ([][2]uint64, error) {
		b, err := os.ReadFile(file)
		if err != nil {
			return nil, fmt.Errorf("cannot read the user namespace's mapping: %w", err)
		}
		var out [][2]uint64
		for line := range strings.Lines(string(b)) {
			f := strings.Fields(line)
			if len(f) != 3 {
				continue
			}
			first, err1 := strconv.ParseUint(f[0], 10, 32)
			n, err2 := strconv.ParseUint(f[2], 10, 32)
			if err1 == nil && err2 == nil {
				out = append(out, [2]uint64{first, first + n})
			}
		}
		return out, nil
	}
	check := func(kind, file string, ids ...uint32) error {
		rs, err := ranges(file)
		if err != nil {
			return err
		}
		for _, id := range ids {
			if !slices.ContainsFunc(rs, func(r [2]uint64) bool { return uint64(id) >= r[0] && uint64(id) < r[1] }) {
				return fmt.Errorf("%s %d is outside the ids the user namespace maps (%s)", kind, id, describe(rs))
			}
		}
		return nil
	}
	if err := check("uid", uidMap, u.UID); err != nil {
		return err
	}
	if err := check("gid", gidMap, u.GID); err != nil {
		return err
	}
	return check("supplementary group", gidMap, u.Groups...)
}

// describe lists id ranges for a message.
func describe(rs [][2]uint64) string {
	if len(rs) == 0 {
		return "none"
	}
	parts := make([]string, len(rs))
	for i, r := range rs {
		parts[i] = fmt.Sprintf("%d-%d", r[0], r[1]-1)
	}
	return strings.Join(parts, ", ")
}
