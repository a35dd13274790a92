//go:build crash

package main

import (
	"bufio"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/google/nftables"
	"github.com/tai42/sandbox"
	"github.com/tai42/sandbox/internal/oscmd"
	"github.com/tai42/sandbox/provider/container"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// rootsDir is where the container provider mounts sessions' roots when it
// remaps users (container.rootsDir).
const rootsDir = "/run/tai42/roots"

// sessionDirs are the state directory's per-session directories, each
// holding one entry per session id: ephemeral workspaces, temp
// directories, bundles, runtime state, network namespace files.
func (c *crashRun) sessionDirs() []string {
	root := filepath.Join(c.state, c.provider)
	if c.provider == container.Name {
		return []string{filepath.Join(root, "sessions"), filepath.Join(root, "runc"), filepath.Join(root, "crun"), filepath.Join(root, "netns")}
	}
	return []string{filepath.Join(root, "sessions"), filepath.Join(root, "tmp")}
}

// checkMachine looks for what is on the machine that no listed session
// owns, and returns the function that reports it (so that a check can
// report the sessions first). before is the listing the probe starts
// from; relist lists again once the probe is done: a session reaped
// meanwhile takes its resources along, so counts must fall between the
// two.
func (c *crashRun) checkMachine(before map[string]sandbox.SessionInfo, relist func() map[string]sandbox.SessionInfo) (report func()) {
	owned := func(id string) bool { _, ok := before[id]; return ok }
	keys := map[string]bool{} // the persistent workspaces the listed sessions hold
	for _, in := range before {
		if in.Durability == sandbox.Persistent {
			keys[in.WorkspaceKey] = true
		}
	}
	var errs []string

	// Exec processes go first: recovery ends them, maybe not at once.
	var procs []stray
	deadline := time.Now().Add(crashProcsWait)
	for {
		procs = c.strayProcesses(owned)
		if len(procs) == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	found, err := c.strayThings(owned, keys)
	if err != nil {
		errs = append(errs, err.Error())
	}
	found = append(procs, found...)
	if len(found) > 0 {
		// A session that expired before the listing is not listed, but
		// owns its resources until the reaper's next pass: what is still
		// there a few passes later is left behind.
		time.Sleep(crashReapWait)
		again, _ := c.strayThings(owned, keys)
		again = append(again, c.strayProcesses(owned)...)
		still := map[stray]bool{}
		for _, s := range again {
			still[s] = true
		}
		found = slices.DeleteFunc(found, func(s stray) bool { return !still[s] })
	}
	var nets *netState
	if c.provider == container.Name {
		if nets, err = readNetState(crashNetPrefix); err != nil {
			errs = append(errs, err.Error())
		}
	}
	after := relist()
	return func() {
		for _, e := range errs {
			c.errorf("%s", e)
		}
		c.reportStrays(found)
		if nets != nil {
			c.checkNet(nets, before, after)
		}
	}
}

// strayThings lists the session directories, cgroups, mounts and disks of
// the run that no listed session owns (keys: the persistent workspaces the
// listed sessions hold).
func (c *crashRun) strayThings(owned func(string) bool, keys map[string]bool) ([]stray, error) {
	var found []stray
	for _, dir := range c.sessionDirs() {
		for _, name := range readDirNames(dir) {
			if !owned(name) {
				found = append(found, stray{id: name, kind: "directories", what: c.rel(filepath.Join(dir, name))})
			}
		}
	}
	for _, cg := range c.sessionCgroups() {
		if !owned(cg.id) {
			found = append(found, stray{id: cg.id, kind: "cgroups", what: cg.path})
		}
	}
	mounts, err := readMountinfo()
	for _, mt := range mounts {
		if c.diskMount(mt.point) {
			continue // strayDisks's
		}
		id, ours := c.mountOwner(mt.point)
		if ours && (id == "" || !owned(id)) {
			found = append(found, stray{id: id, kind: "mounts", what: fmt.Sprintf("%s (%s)", c.rel(mt.point), mt.fstype)})
		}
	}
	if c.provider == container.Name {
		found = append(found, c.strayDisks(owned, keys, mounts)...)
	}
	if c.provider == container.Name {
		for _, id := range readDirNames(rootsDir) {
			if c.seen[id] && !owned(id) {
				found = append(found, stray{id: id, kind: "directories", what: filepath.Join(rootsDir, id)})
			}
		}
	}
	return found, err
}

// The container provider's disk cap (container.Options.DiskMB): a
// session's disk is <provider>/disks/NAME.img, on a loop device, mounted at
// disks/NAME where the runtime runs (this process's namespace for runc,
// the daemon's own for crun), its root overlay's upper layer in it; a
// persistent workspace is workspaces/KEY.img, mounted at
// workspaces/+mnt/KEY while a session holds the key; the daemon keeps a
// pool of container.DefaultDiskPool disks made ahead, mounted, for no
// session yet.
func (c *crashRun) disksDir() string { return filepath.Join(c.state, c.provider, "disks") }
func (c *crashRun) wsMountDir() string {
	return filepath.Join(c.state, c.provider, "workspaces", "+mnt")
}

// diskMount says whether mount point p is a disk's or a workspace image's.
func (c *crashRun) diskMount(p string) bool {
	return c.provider == container.Name && (filepath.Dir(p) == c.disksDir() || filepath.Dir(p) == c.wsMountDir())
}

// strayDisks lists the disks, workspace image mounts and loop devices of
// the run that no listed session owns. A session owns the disk its root
// overlay's upper layer is on (the overlay is mounted at its root, in
// this process's mount namespace or in one of the daemon's threads'),
// and the image and mount of the persistent workspace it holds. While a
// daemon runs, up to its pool's size of disks no session owns, each with
// its image and its mount, are the pool's.
func (c *crashRun) strayDisks(owned func(string) bool, keys map[string]bool, mounts []mountEntry) []stray {
	if c.d != nil {
		// crun's mounts are in the daemon's own mount namespace.
		tasks, _ := os.ReadDir(fmt.Sprintf("/proc/%d/task", c.d.cmd.Process.Pid))
		for _, task := range tasks {
			more, _ := readMountinfoFile(fmt.Sprintf("/proc/%d/task/%s/mountinfo", c.d.cmd.Process.Pid, task.Name()))
			mounts = append(mounts, more...)
		}
	}
	disks, wsMnt := c.disksDir(), c.wsMountDir()
	owner := map[string]string{} // disk name → session id
	mounted := map[string]bool{} // disk names mounted, anywhere
	var found []stray
	for _, mt := range mounts {
		switch {
		case mt.fstype == "overlay":
			for _, o := range strings.Split(mt.superOpts, ",") {
				if upper, ok := strings.CutPrefix(o, "upperdir="); ok && filepath.Dir(filepath.Dir(upper)) == disks {
					if id, ours := c.mountOwner(mt.point); ours && id != "" {
						owner[filepath.Base(filepath.Dir(upper))] = id
					}
				}
			}
		case filepath.Dir(mt.point) == disks:
			mounted[filepath.Base(mt.point)] = true
		case filepath.Dir(mt.point) == wsMnt:
			if key := filepath.Base(mt.point); !keys[key] {
				found = append(found, stray{kind: "mounts", what: fmt.Sprintf("%s (%s), the image of persistent workspace %q, which no listed session holds", c.rel(mt.point), mt.fstype, key)})
			}
		}
	}
	names := map[string]bool{}
	for _, n := range readDirNames(disks) {
		names[strings.TrimSuffix(n, ".img")] = true
	}
	for n := range mounted {
		names[n] = true
	}
	pool := 0
	if c.d != nil {
		pool = container.DefaultDiskPool
	}
	spare := 0
	strayDisk := map[string]bool{}
	for _, name := range slices.Sorted(maps.Keys(names)) {
		id := owner[name]
		if id != "" && owned(id) {
			continue
		}
		img := filepath.Join(disks, name+".img")
		_, err := os.Stat(img)
		if id == "" && err == nil && mounted[name] && spare < pool {
			spare++ // the pool's
			continue
		}
		strayDisk[name] = true
		var what []string
		if err == nil {
			what = append(what, "image "+c.rel(img))
		}
		if _, err := os.Lstat(filepath.Join(disks, name)); err == nil {
			what = append(what, "mount point "+c.rel(filepath.Join(disks, name)))
		}
		if mounted[name] {
			what = append(what, "mounted")
		}
		found = append(found, stray{id: id, kind: "disks", what: fmt.Sprintf("disk %s (%s)", name, strings.Join(what, ", "))})
	}
	for _, key := range readDirNames(wsMnt) {
		if !keys[key] {
			found = append(found, stray{kind: "directories", what: c.rel(filepath.Join(wsMnt, key)) + ", the mount point of a workspace image no listed session holds"})
		}
	}
	for _, n := range readDirNames(filepath.Dir(wsMnt)) {
		if strings.HasSuffix(n, ".img.new") {
			found = append(found, stray{kind: "disks", what: c.rel(filepath.Join(filepath.Dir(wsMnt), n)) + ", a workspace image half made"})
		}
	}
	loops, err := loopsOn(c.state)
	if err != nil {
		found = append(found, stray{kind: "loop devices", what: "cannot list the loop devices: " + err.Error()})
	}
	for _, dev := range slices.Sorted(maps.Keys(loops)) {
		file := loops[dev]
		name, isDisk := strings.CutSuffix(strings.TrimPrefix(file, disks+"/"), ".img")
		key, isWS := strings.CutSuffix(strings.TrimPrefix(file, filepath.Dir(wsMnt)+"/"), ".img")
		switch {
		case strings.HasSuffix(file, " (deleted)"):
		case isDisk && !strings.Contains(name, "/") && !strayDisk[name] && names[name]:
			continue // a session's, or the pool's
		case isWS && !strings.Contains(key, "/") && keys[key]:
			continue
		}
		found = append(found, stray{id: owner[name], kind: "loop devices", what: fmt.Sprintf("/dev/%s on %s", dev, c.rel(file))})
	}
	return found
}

// loopsOn lists the loop devices whose backing file is under dir, as
// device name → backing file (" (deleted)" when it was removed).
func loopsOn(dir string) (map[string]string, error) {
	entries, err := os.ReadDir("/sys/block")
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join("/sys/block", e.Name(), "loop", "backing_file"))
		if f := strings.TrimSpace(string(b)); err == nil && strings.HasPrefix(f, dir+"/") {
			out[e.Name()] = f
		}
	}
	return out, nil
}

// stray is one thing on the machine that no listed session owns.
type stray struct {
	id   string // the session it is named by; "" for none
	kind string // processes, directories, cgroups, mounts, disks, loop devices
	what string
}

// reportStrays reports what was found, one failure per session, each
// thing once per run (it stays from round to round).
func (c *crashRun) reportStrays(found []stray) {
	byID := map[string]map[string][]string{}
	for _, s := range found {
		key := s.id + "\x00" + s.kind + "\x00" + s.what
		if c.reported[key] {
			continue
		}
		c.reported[key] = true
		if byID[s.id] == nil {
			byID[s.id] = map[string][]string{}
		}
		byID[s.id][s.kind] = append(byID[s.id][s.kind], s.what)
	}
	for _, id := range slices.Sorted(maps.Keys(byID)) {
		var parts []string
		for _, kind := range []string{"processes", "directories", "mounts", "disks", "loop devices", "cgroups"} {
			items := byID[id][kind]
			if len(items) == 0 {
				continue
			}
			if kind == "cgroups" {
				// One name in many hierarchies: each name once.
				where := map[string][]string{}
				for _, p := range items {
					name := filepath.Base(p)
					dir := filepath.Dir(p)
					if parent := filepath.Base(dir); parent == "tai42" || parent == "tai42-host" {
						name, dir = parent+"/"+name, filepath.Dir(dir)
					}
					where[name] = append(where[name], strings.TrimPrefix(dir, "/sys/fs/cgroup/"))
				}
				for _, name := range slices.Sorted(maps.Keys(where)) {
					parts = append(parts, fmt.Sprintf("cgroup %s in /sys/fs/cgroup/{%s}", name, strings.Join(where[name], ",")))
				}
				continue
			}
			parts = append(parts, kind+": "+strings.Join(items, ", "))
		}
		log := ""
		if id != "" {
			log = c.daemonSays(id)
		}
		c.errorf("left behind for %s:\n\t%s%s", c.owner(id), strings.Join(parts, "\n\t"), log)
	}
}

// owner says whose an id is, for a leftover's description.
func (c *crashRun) owner(id string) string {
	switch {
	case id == "":
		return "no session's"
	case c.m.goneWhy(id) != "":
		return "session " + id + ", " + c.m.goneWhy(id)
	case !strings.HasPrefix(id, "sb-"):
		return "not a session id"
	}
	return "session " + id + ", not listed"
}

func (m *model) goneWhy(id string) string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.gone[id]
}

// rel shows path relative to the state directory, as <state>/...
func (c *crashRun) rel(path string) string {
	if r, err := filepath.Rel(c.state, path); err == nil && !strings.HasPrefix(r, "..") {
		return "<state>/" + r
	}
	return path
}

// mountOwner says whether the path p (a mount point, a cwd) is the run's
// (under the state directory, or a session root of an id it has seen) and
// which session's it is ("" for none).
func (c *crashRun) mountOwner(p string) (id string, ours bool) {
	if rest, ok := strings.CutPrefix(p, rootsDir+"/"); ok {
		id, _, _ = strings.Cut(rest, "/")
		return id, c.seen[id]
	}
	rest, ok := strings.CutPrefix(p, c.state+"/")
	if !ok {
		return "", false
	}
	// <provider>/{sessions,netns,runc,crun}/<id>/...
	parts := strings.Split(rest, "/")
	if len(parts) >= 3 && strings.HasPrefix(parts[2], "sb-") {
		return parts[2], true
	}
	return "", true
}

// sessionCgroup is a cgroup directory named by a session id.
type sessionCgroup struct{ id, path string }

// sessionCgroups lists the cgroups of the ids the run has seen: the
// container provider's <hierarchy>/tai42/<id>; the host runner's
// tracking groups <cgroup2>/tai42-host/<id> and its caps groups
// tai42-<id> below this process's own cgroup (the daemon's, which it
// inherits) in each hierarchy.
func (c *crashRun) sessionCgroups() []sessionCgroup {
	var out []sessionCgroup
	for _, b := range cgroupBases(c.provider == container.Name) {
		for _, name := range readDirNames(b.dir) {
			id, ok := strings.CutPrefix(name, b.prefix)
			if ok && c.seen[id] {
				out = append(out, sessionCgroup{id: id, path: filepath.Join(b.dir, name)})
			}
		}
	}
	return out
}

// cgroupBase is a directory holding sessions' cgroups, each named prefix
// and the session id.
type cgroupBase struct{ dir, prefix string }

// cgroupBases are where sessions' cgroups are made, in every cgroup
// hierarchy mounted whole: its tai42 directory (container); its
// tai42-host directory (cgroup2) and this process's own cgroup (host).
func cgroupBases(containerLayout bool) []cgroupBase {
	mounts, _ := readMountinfo()
	own := map[string]string{} // controller ("" for v2) -> this process's path
	if b, err := os.ReadFile("/proc/self/cgroup"); err == nil {
		for line := range strings.SplitSeq(strings.TrimSpace(string(b)), "\n") {
			parts := strings.SplitN(line, ":", 3)
			if len(parts) != 3 {
				continue
			}
			if parts[1] == "" {
				own[""] = parts[2]
			}
			for ctl := range strings.SplitSeq(parts[1], ",") {
				own[ctl] = parts[2]
			}
		}
	}
	var out []cgroupBase
	for _, mt := range mounts {
		if mt.fstype != "cgroup" && mt.fstype != "cgroup2" || mt.root != "/" {
			continue
		}
		if containerLayout {
			out = append(out, cgroupBase{dir: filepath.Join(mt.point, "tai42")})
			continue
		}
		path, ok := own[""]
		if mt.fstype == "cgroup2" {
			out = append(out, cgroupBase{dir: filepath.Join(mt.point, "tai42-host")})
		} else {
			path, ok = "", false
			for o := range strings.SplitSeq(mt.superOpts, ",") {
				if p, has := own[o]; has && o != "" {
					path, ok = p, true
					break
				}
			}
		}
		if ok {
			out = append(out, cgroupBase{dir: filepath.Join(mt.point, path), prefix: "tai42-"})
		}
	}
	slices.SortFunc(out, func(a, b cgroupBase) int { return strings.Compare(a.dir+a.prefix, b.dir+b.prefix) })
	return slices.Compact(out)
}

// mountEntry is one line of /proc/self/mountinfo.
type mountEntry struct {
	root, point, fstype, superOpts string
}

func readMountinfo() ([]mountEntry, error) { return readMountinfoFile("/proc/self/mountinfo") }

// readMountinfoFile reads a mountinfo file: a process's or a thread's.
func readMountinfoFile(name string) ([]mountEntry, error) {
	f, err := os.Open(name)
	if err != nil {
		return nil, fmt.Errorf("reading the mount table: %w", err)
	}
	defer f.Close()
	var out []mountEntry
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		sep := slices.Index(fields, "-")
		if sep < 5 || sep+3 >= len(fields) {
			continue
		}
		out = append(out, mountEntry{root: oscmd.UnescapeMount(fields[3]), point: oscmd.UnescapeMount(fields[4]),
			fstype: fields[sep+1], superOpts: fields[sep+3]})
	}
	return out, sc.Err()
}

// procEntry is a live (not zombie) process.
type procEntry struct {
	pid    int
	cmd    string // its command line, spaces between the arguments
	cwd    string
	cgroup string // /proc/PID/cgroup
}

func readProcs() []procEntry {
	var out []procEntry
	self := os.Getpid()
	for _, name := range readDirNames("/proc") {
		pid, err := strconv.Atoi(name)
		if err != nil || pid == self {
			continue
		}
		dir := "/proc/" + name
		stat, err := os.ReadFile(dir + "/stat")
		if err != nil {
			continue
		}
		if i := strings.LastIndexByte(string(stat), ')'); i < 0 || i+2 >= len(stat) || stat[i+2] == 'Z' {
			continue
		}
		cmd, _ := os.ReadFile(dir + "/cmdline")
		cwd, _ := os.Readlink(dir + "/cwd")
		cg, _ := os.ReadFile(dir + "/cgroup")
		out = append(out, procEntry{pid: pid, cmd: strings.TrimSpace(strings.ReplaceAll(string(cmd), "\x00", " ")), cwd: cwd, cgroup: string(cg)})
	}
	return out
}

// strayProcesses describes the processes that no listed session owns: a
// streamed exec's of this run (each session's execs end at a restart), one
// working in the state directory, one in the cgroup of a session not
// listed.
func (c *crashRun) strayProcesses(owned func(string) bool) []stray {
	markRE := regexp.MustCompile(`crashmark-` + c.runID + `-(\d+)`)
	cgRE := cgroupIDRE(c.provider)
	var out []stray
	for _, p := range readProcs() {
		id, what := "", ""
		if m := markRE.FindStringSubmatch(p.cmd); m != nil {
			n, _ := strconv.Atoi(m[1])
			id, what = c.m.execSession(n), c.m.execWhere(n)+", running after the restart"
		} else if p.cwd == c.state || strings.HasPrefix(p.cwd, c.state+"/") {
			id, _ = c.mountOwner(p.cwd) // <state>/<provider>/sessions/<id>/...
			what = "working in " + c.rel(p.cwd)
		} else if m := cgRE.FindStringSubmatch(p.cgroup); m != nil && c.seen[m[1]] && !owned(m[1]) {
			id, what = m[1], "in its cgroup"
		} else {
			continue
		}
		out = append(out, stray{id: id, kind: "processes", what: fmt.Sprintf("%d %q, %s", p.pid, clipText(p.cmd), what)})
	}
	return out
}

// cgroupIDRE finds a session's cgroup in /proc/PID/cgroup.
func cgroupIDRE(provider string) *regexp.Regexp {
	if provider == container.Name {
		return regexp.MustCompile(`/tai42/(sb-[0-9a-f]+)`)
	}
	return regexp.MustCompile(`/tai42-(?:host/)?(sb-[0-9a-f]+)`)
}

// netState is what of a network prefix is on the machine.
type netState struct {
	veths   map[string][]string // bridge name ("" for none) -> veths attached
	bridges map[string]bool
	table   bool
}

var vethRE = regexp.MustCompile(`^v[0-9a-f]{8}$`)

func readNetState(prefix string) (*netState, error) {
	links, err := netlink.LinkList()
	if err != nil {
		return nil, fmt.Errorf("listing the network links: %w", err)
	}
	byIndex := map[int]string{}
	for _, l := range links {
		byIndex[l.Attrs().Index] = l.Attrs().Name
	}
	ns := &netState{veths: map[string][]string{}, bridges: map[string]bool{}}
	for _, l := range links {
		name := l.Attrs().Name
		rest, ok := strings.CutPrefix(name, prefix)
		switch {
		case !ok:
		case rest == "-int" || rest == "-egr":
			ns.bridges[name] = true
		case vethRE.MatchString(rest):
			master := byIndex[l.Attrs().MasterIndex]
			ns.veths[master] = append(ns.veths[master], name)
		}
	}
	conn, err := nftables.New()
	if err != nil {
		return nil, fmt.Errorf("opening nftables: %w", err)
	}
	tables, err := conn.ListTablesOfFamily(nftables.TableFamilyINet)
	if err != nil {
		return nil, fmt.Errorf("listing the nftables tables: %w", err)
	}
	for _, t := range tables {
		if t.Name == prefix {
			ns.table = true
		}
	}
	return ns, nil
}

// preflightNet makes sure nothing of the container daemon's network prefix
// is on the machine before the run: the checks count what it names.
func (c *crashRun) preflightNet() {
	ns, err := readNetState(crashNetPrefix)
	if err != nil {
		c.t.Fatal(err)
	}
	var there []string
	for name := range ns.bridges {
		there = append(there, "bridge "+name)
	}
	for _, vs := range ns.veths {
		there = append(there, vs...)
	}
	if ns.table {
		there = append(there, "nftables table inet "+crashNetPrefix)
	}
	if len(there) > 0 {
		c.t.Fatalf("the network prefix %q of the crash test's daemon is in use on this machine (%s): another crash test runs, or a killed one left them. Stop it, or remove them (ip link del NAME; nft delete table inet %s)",
			crashNetPrefix, strings.Join(there, ", "), crashNetPrefix)
	}
	c.ownNet = true
}

// checkNet checks the container daemon's links and table against the
// sessions listed before and after they were read.
func (c *crashRun) checkNet(ns *netState, before, after map[string]sandbox.SessionInfo) {
	count := func(listed map[string]sandbox.SessionInfo, tier sandbox.Network) int {
		n := 0
		c.m.mu.Lock()
		defer c.m.mu.Unlock()
		for id := range listed {
			if s := c.m.sessions[id]; s != nil && s.spec.Network == tier {
				n++
			} else if s == nil && c.m.pendingNetwork(listed[id]) == tier {
				n++
			}
		}
		return n
	}
	nets := 0
	for _, tier := range []sandbox.Network{sandbox.NetworkInternal, sandbox.NetworkEgress} {
		bridge := crashNetPrefix + "-int"
		if tier == sandbox.NetworkEgress {
			bridge = crashNetPrefix + "-egr"
		}
		lo, hi := count(after, tier), count(before, tier)
		nets += hi
		got := len(ns.veths[bridge])
		switch {
		case got > hi:
			c.leftover("veths "+strings.Join(ns.veths[bridge], ","), fmt.Sprintf("%d veths on bridge %s for %d listed %s sessions: %v", got, bridge, hi, tier, ns.veths[bridge]))
		case got < lo:
			c.errorf("%d veths on bridge %s for %d listed %s sessions: a session's network is missing", got, bridge, lo, tier)
		}
		switch {
		case ns.bridges[bridge] && hi == 0:
			c.leftover("bridge "+bridge, fmt.Sprintf("bridge %s, with no %s session listed", bridge, tier))
		case !ns.bridges[bridge] && lo > 0:
			c.errorf("bridge %s is missing, with %d %s sessions listed", bridge, lo, tier)
		}
	}
	for master, vs := range ns.veths {
		if master != crashNetPrefix+"-int" && master != crashNetPrefix+"-egr" {
			c.leftover("veths "+strings.Join(vs, ","), fmt.Sprintf("veths %v, on no bridge of the daemon's (master %q)", vs, master))
		}
	}
	switch {
	case ns.table && nets == 0:
		c.leftover("table", fmt.Sprintf("nftables table inet %s, with no internal or egress session listed", crashNetPrefix))
	case !ns.table && count(after, sandbox.NetworkInternal)+count(after, sandbox.NetworkEgress) > 0:
		c.errorf("the nftables table inet %s is missing, with internal or egress sessions listed: their bridges are not fenced", crashNetPrefix)
	}
}

// pendingNetwork is the network of a listed session the client does not
// know yet (its create was in flight at the kill). mu held.
func (m *model) pendingNetwork(in sandbox.SessionInfo) sandbox.Network {
	n, _ := strconv.Atoi(in.Labels["crash-n"])
	if pc := m.pending[n]; pc != nil {
		return pc.spec.Network
	}
	return ""
}

// execSession is the session of streamed exec n; "" when unknown.
func (m *model) execSession(n int) string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.execIDs[n]
}

// execWhere names streamed exec n for a failure message.
func (m *model) execWhere(n int) string {
	m.mu.Lock()
	defer m.mu.Unlock()
	if w, ok := m.execNames[n]; ok {
		return w
	}
	return fmt.Sprintf("streamed exec #%d", n)
}

// removeLeftovers removes by hand what the daemons left of this run:
// processes (by pid: the daemons' children), mounts, session roots,
// cgroups, and the network prefix's links and table when the run found
// none of them. It returns what it removed.
func (c *crashRun) removeLeftovers() []string {
	var done []string
	cgRE := cgroupIDRE(c.provider)
	markRE := regexp.MustCompile(`crashmark-` + c.runID + `-`)
	for range 3 {
		killed := 0
		for _, p := range readProcs() {
			m := cgRE.FindStringSubmatch(p.cgroup)
			if markRE.MatchString(p.cmd) || p.cwd == c.state || strings.HasPrefix(p.cwd, c.state+"/") || m != nil && c.seen[m[1]] {
				if syscall.Kill(p.pid, syscall.SIGKILL) == nil {
					done = append(done, fmt.Sprintf("killed process %d (%s)", p.pid, clipText(p.cmd)))
					killed++
				}
			}
		}
		if killed == 0 {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	mounts, _ := readMountinfo()
	var points []string
	for _, mt := range mounts {
		if _, ours := c.mountOwner(mt.point); ours {
			points = append(points, mt.point)
		}
	}
	// Deepest first, each once (stacked mounts repeat).
	slices.SortFunc(points, func(a, b string) int { return len(b) - len(a) })
	points = slices.Compact(points)
	for _, p := range points {
		if err := unix.Unmount(p, unix.MNT_DETACH); err == nil {
			done = append(done, "unmounted "+p)
		}
	}
	// The disks' loop devices detach themselves once unmounted; one that
	// something else still holds is marked to.
	if loops, err := loopsOn(c.state); err == nil {
		for dev, file := range loops {
			if fd, err := unix.Open("/dev/"+dev, unix.O_RDONLY|unix.O_CLOEXEC, 0); err == nil {
				if unix.IoctlSetInt(fd, unix.LOOP_CLR_FD, 0) == nil {
					done = append(done, "detached /dev/"+dev+" from "+file)
				}
				unix.Close(fd)
			}
		}
	}
	for _, id := range readDirNames(rootsDir) {
		if c.seen[id] {
			if err := os.RemoveAll(filepath.Join(rootsDir, id)); err == nil {
				done = append(done, "removed "+filepath.Join(rootsDir, id))
			}
		}
	}
	for _, cg := range c.sessionCgroups() {
		if err := removeCgroup(cg.path); err == nil {
			done = append(done, "removed cgroup "+cg.path)
		}
	}
	if c.ownNet {
		if ns, err := readNetState(crashNetPrefix); err == nil {
			var names []string
			for _, vs := range ns.veths {
				names = append(names, vs...)
			}
			for b := range ns.bridges {
				names = append(names, b)
			}
			for _, name := range names {
				if l, err := netlink.LinkByName(name); err == nil && netlink.LinkDel(l) == nil {
					done = append(done, "deleted link "+name)
				}
			}
			if ns.table {
				if conn, err := nftables.New(); err == nil {
					conn.DelTable(&nftables.Table{Name: crashNetPrefix, Family: nftables.TableFamilyINet})
					if conn.Flush() == nil {
						done = append(done, "deleted nftables table inet "+crashNetPrefix)
					}
				}
			}
		}
	}
	return done
}

// removeCgroup removes a cgroup directory and the ones below it, deepest
// first, waiting a little for killed processes to leave it.
func removeCgroup(path string) error {
	var dirs []string
	_ = filepath.WalkDir(path, func(p string, d os.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			dirs = append(dirs, p)
		}
		return nil
	})
	slices.Reverse(dirs)
	var err error
	for range 20 {
		err = nil
		for _, d := range dirs {
			if e := os.Remove(d); e != nil && !errors.Is(e, os.ErrNotExist) {
				err = e
			}
		}
		if err == nil {
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	return err
}
