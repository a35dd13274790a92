package server

import (
	"testing"

	"github.com/tai42/sandbox/api"
)

// BenchmarkDecodeStrict: the strict decode of the two JSON bodies every
// session sees, a create and an exec, as the handlers decode them.
func BenchmarkDecodeStrict(b *testing.B) {
	const createBody = `{"image":"host","workspace_key":"proj","durability":"persistent","env":{"PATH":"/usr/bin:/bin","HOME":"/workspace","LANG":"C.UTF-8"},` +
		`"network":"egress","isolation":"container","cpu":1.5,"memory_mb":512,"ttl_seconds":600,"labels":{"owner":"bench","run":"42"}}`
	const execBody = `{"argv":["sh","-c","echo hello; ls -l /workspace"],"cwd":"sub","env":{"A":"1","B":"2"},"stdin_base64":"aGVsbG8K","timeout_seconds":30,"user":"nobody"}`
	for _, c := range []struct {
		name, body string
		v          func() any
	}{
		{"create", createBody, func() any { return new(api.SessionSpec) }},
		{"exec", execBody, func() any { return new(api.ExecRequest) }},
	} {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(c.body)))
			for b.Loop() {
				if err := decodeStrict([]byte(c.body), c.v()); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
