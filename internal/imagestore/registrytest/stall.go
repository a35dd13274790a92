package registrytest

import (
	"context"
	"crypto/tls"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"testing"
)

// StallAfter is how many bytes of a blob a StallingFront passes before it
// stalls: more than an image config, less than a layer of any size.
const StallAfter = 32 << 10

// Front is a proxy in front of a registry.
type Front struct {
	srv *httptest.Server
}

// Host is the front's "127.0.0.1:PORT", to pull through it.
func (f *Front) Host() string { return f.srv.Listener.Addr().String() }

// StallingFront is a registry that stalls mid-blob: a reverse proxy to r
// that passes every request, but sends only the first StallAfter bytes of
// a blob's body and then nothing, holding the connection open until the
// client gives up or the test ends. It serves what r serves (HTTP or TLS
// with r's certificate).
func (r *Registry) StallingFront(t testing.TB) *Front {
	t.Helper()
	target, err := url.Parse(r.URL())
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	proxy := httputil.NewSingleHostReverseProxy(target)
	proxy.Transport = r.Transport()
	proxy.FlushInterval = -1 // what passes reaches the client at once
	proxy.ModifyResponse = func(resp *http.Response) error {
		if resp.Request.Method == http.MethodGet && strings.Contains(resp.Request.URL.Path, "/blobs/") && resp.StatusCode == http.StatusOK {
			resp.Body = &stallingBody{rc: resp.Body, left: StallAfter, ctx: resp.Request.Context(), done: done}
		}
		return nil
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(proxy)
	srv.Listener.Close()
	srv.Listener = l
	if r.opts.TLS {
		srv.TLS = &tls.Config{Certificates: []tls.Certificate{r.cert}, MinVersion: tls.VersionTLS12}
		srv.StartTLS()
	} else {
		srv.Start()
	}
	t.Cleanup(func() {
		close(done)
		srv.CloseClientConnections()
		srv.Close()
	})
	return &Front{srv: srv}
}

// stallingBody passes left bytes of rc, then blocks until the request
// ends or the front closes.
type stallingBody struct {
	rc   io.ReadCloser
	left int
	ctx  context.Context
	done <-chan struct{}
}

func (b *stallingBody) Read(p []byte) (int, error) {
	if b.left <= 0 {
		select {
		case <-b.ctx.Done():
			return 0, b.ctx.Err()
		case <-b.done:
			return 0, io.ErrUnexpectedEOF
		}
	}
	if len(p) > b.left {
		p = p[:b.left]
	}
	n, err := b.rc.Read(p)
	b.left -= n
	return n, err
}

func (b *stallingBody) Close() error { return b.rc.Close() }
