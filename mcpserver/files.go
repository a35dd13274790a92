package mcpserver

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/tai42/sandbox"
)

// readRange reads up to length bytes of path from offset, and the file's
// size. With a FileStreamer only those bytes are held (the ones before
// offset still pass by); without, the whole file is read first.
func readRange(ctx context.Context, sess sandbox.Session, path string, offset int64, length int) ([]byte, int64, error) {
	if fs, ok := sess.(sandbox.FileStreamer); ok {
		rc, size, err := fs.OpenFile(ctx, path)
		if err != nil {
			return nil, 0, err
		}
		defer rc.Close()
		if offset >= size {
			return []byte{}, size, nil
		}
		if _, err := io.CopyN(io.Discard, rc, offset); err != nil {
			return nil, 0, sandbox.WrapError("get_file", fmt.Sprintf("reading %s up to offset %d", path, offset), err)
		}
		data, err := io.ReadAll(io.LimitReader(rc, int64(length)))
		if err != nil {
			return nil, 0, sandbox.WrapError("get_file", fmt.Sprintf("reading %s", path), err)
		}
		return data, size, nil
	}
	data, err := sess.GetFile(ctx, path)
	if err != nil {
		return nil, 0, err
	}
	size := int64(len(data))
	if offset >= size {
		return []byte{}, size, nil
	}
	return data[offset:min(size, offset+int64(length))], size, nil
}

// listScript lists the directory $1 as NUL-terminated "TYPE SIZE NAME"
// records; it exits 3 when $1 is no directory it can enter. sh, test and
// stat (or wc) are all an image needs: busybox has them.
const listScript = `cd -- "$1" 2>/dev/null || { echo "no directory at $1" >&2; exit 3; }
for f in * .[!.]* ..?*; do
  [ -e "$f" ] || [ -L "$f" ] || continue
  s=0
  if [ -L "$f" ]; then t=symlink
  elif [ -d "$f" ]; then t=dir
  elif [ -f "$f" ]; then t=file; s=$(stat -c %s -- "$f" 2>/dev/null || wc -c <"$f")
  else t=other
  fi
  printf '%s %s %s\0' "$t" "$s" "$f"
done`

const listTimeout = 30 * time.Second

func (s *Server) listDir(ctx context.Context, _ *conn, in listDirIn) (listDirOut, error) {
	path := in.Path
	if path == "" {
		path = "."
	}
	sess, err := s.session(ctx, in.SessionID)
	if err != nil {
		return listDirOut{}, err
	}
	res, err := sess.Exec(ctx, []string{"sh", "-c", listScript, "sh", path}, sandbox.ExecOptions{Timeout: listTimeout})
	if err != nil {
		return listDirOut{}, s.evictOn(in.SessionID, err)
	}
	switch res.ExitCode {
	case 0:
	case 3:
		return listDirOut{}, fmt.Errorf("no directory at %s in the session", clip(path))
	case 127:
		return listDirOut{}, fmt.Errorf("list_dir runs sh in the session, which its image lacks: %s", strings.TrimSpace(clip(res.Stderr)))
	default:
		return listDirOut{}, fmt.Errorf("listing %s failed (exit %d): %s", clip(path), res.ExitCode, strings.TrimSpace(clip(res.Stderr)))
	}
	out := listDirOut{Path: in.Path, Entries: []dirEntry{}}
	for rec := range bytes.SplitSeq([]byte(res.Stdout), []byte{0}) {
		if len(rec) == 0 {
			continue
		}
		typ, rest, _ := strings.Cut(string(rec), " ")
		size, name, _ := strings.Cut(rest, " ")
		e := dirEntry{Name: name, Type: typ}
		if typ == "file" {
			e.Size, _ = strconv.ParseInt(strings.TrimSpace(size), 10, 64)
		}
		out.Entries = append(out.Entries, e)
	}
	return out, nil
}
