package kit_test

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/tai42/sandbox/kit"
)

// Whatever the caller sends, a path the kit accepts for a session that
// shares the host's filesystem stays inside the workspace. Run longer with
// go test -fuzz FuzzResolve ./kit.
func FuzzResolve(f *testing.F) {
	for _, s := range []string{"", ".", "..", "a/b", "../x", "a/../../x", "/state/ws/f", "/state/ws/../ws2", "/state/wsx", "/etc/passwd", "a\x00b", "./././..", "a//b/../..", "/", "//state//ws//x"} {
		f.Add(s, true)
		f.Add(s, false)
	}
	const ws = "/state/ws"
	f.Fuzz(func(t *testing.T, path string, allowEmpty bool) {
		p, err := kit.Resolve("op", ws, path, allowEmpty, true)
		if err != nil {
			return
		}
		if !p.InWorkspace() {
			t.Fatalf("Resolve(%q) accepted a path outside the workspace: %+v", path, p)
		}
		if p.Rel != "." && !filepath.IsLocal(p.Rel) {
			t.Fatalf("Resolve(%q).Rel = %q is not a local path", path, p.Rel)
		}
		if p.Abs != filepath.Join(ws, p.Rel) || !(p.Abs == ws || strings.HasPrefix(p.Abs, ws+"/")) {
			t.Fatalf("Resolve(%q) = %+v: Abs is not the workspace joined with Rel", path, p)
		}
		if strings.IndexByte(path, 0) >= 0 {
			t.Fatalf("Resolve(%q) accepted a NUL byte", path)
		}
	})
}
