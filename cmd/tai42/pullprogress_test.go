package main

import (
	"bytes"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/vbauerster/mpb/v8"

	"github.com/tai42/sandbox"
)

// pullEvents are the events of a pull of two layers, one held already,
// the other fetched in two steps.
func pullEvents() (evs []sandbox.PullProgress, held, fetched string, info sandbox.ImageInfo) {
	const ref = "localhost:5000/tools/box:1"
	held = "sha256:" + strings.Repeat("a1", 32)
	fetched = "sha256:" + strings.Repeat("b2", 32)
	digest := "sha256:" + strings.Repeat("c3", 32)
	evs = []sandbox.PullProgress{
		{Ref: ref, Status: sandbox.PullResolved, Digest: digest},
		{Ref: ref, Status: sandbox.PullLayerExists, Layer: held},
		{Ref: ref, Status: sandbox.PullLayerFetching, Layer: fetched, Done: 1 << 20, Total: 4 << 20},
		{Ref: ref, Status: sandbox.PullLayerFetching, Layer: fetched, Done: 4 << 20, Total: 4 << 20},
		{Ref: ref, Status: sandbox.PullLayerDone, Layer: fetched, Done: 4 << 20, Total: 4 << 20},
		{Ref: ref, Status: sandbox.PullComplete, Digest: digest},
	}
	info = sandbox.ImageInfo{Name: ref, ID: "sha256:" + strings.Repeat("d4", 32), Digest: digest, Platform: "linux/amd64", Size: 9 << 20, Layers: 2, Pulled: time.Now()}
	return evs, held, fetched, info
}

func TestPullRendererBars(t *testing.T) {
	evs, held, fetched, info := pullEvents()
	var out, errb bytes.Buffer
	// A buffer is no terminal: ForceTTY and WithAutoRefresh draw as on one.
	r := newBarPull(&out, &errb, mpb.ForceTTY(), mpb.WithAutoRefresh(), mpb.WithWidth(120))
	for _, ev := range evs {
		r.event(ev)
		time.Sleep(250 * time.Millisecond) // let each state be drawn (frames every 150ms)
	}
	if err := r.finish(info, nil); err != nil {
		t.Fatal(err)
	}
	if out.String() != info.Name+"\n" {
		t.Errorf("stdout %q, want the name", out.String())
	}
	screen := errb.String()
	for _, want := range []string{
		info.Name + ": resolved to " + info.Digest,
		shortLayer(held), "already held",
		shortLayer(fetched), "4.0 MiB / 4.0 MiB", "done",
		"MiB/s", // the speed, while it was fetched
		"\x1b[", // redrawn in place
		"pulled " + info.Name + " (" + info.Digest + "): 1 layer(s) fetched (4.19MB), 1 already held",
	} {
		if !strings.Contains(screen, want) {
			t.Errorf("the bars lack %q:\n%s", want, screen)
		}
	}
}

func TestPullRendererBarsFailed(t *testing.T) {
	evs, _, fetched, _ := pullEvents()
	var out, errb bytes.Buffer
	r := newBarPull(&out, &errb, mpb.ForceTTY(), mpb.WithAutoRefresh())
	r.event(evs[0])
	r.event(evs[2])
	boom := errors.New("registry gone")
	done := make(chan error)
	go func() { done <- r.finish(sandbox.ImageInfo{}, boom) }()
	select {
	case err := <-done:
		if !errors.Is(err, boom) {
			t.Errorf("finish: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("finish hangs on a bar that never completed")
	}
	if out.Len() != 0 || !strings.Contains(errb.String(), shortLayer(fetched)) || strings.Contains(errb.String(), "pulled") {
		t.Errorf("a failed pull: stdout %q, stderr %q", out.String(), errb.String())
	}
}

func TestPullRendererLines(t *testing.T) {
	evs, held, fetched, info := pullEvents()
	var out, errb bytes.Buffer
	r := newPullRenderer(false, false, &out, &errb)
	if _, ok := r.(*linePull); !ok {
		t.Fatalf("a buffer's renderer is %T, want lines", r)
	}
	for _, ev := range evs {
		r.event(ev)
	}
	if err := r.finish(info, nil); err != nil {
		t.Fatal(err)
	}
	want := info.Name + ": resolved to " + info.Digest + "\n" +
		shortLayer(held) + ": already held\n" +
		shortLayer(fetched) + ": fetched 4.19MB\n" +
		"pulled " + info.Name + " (" + info.Digest + "): 1 layer(s) fetched (4.19MB), 1 already held\n"
	if errb.String() != want || out.String() != info.Name+"\n" {
		t.Errorf("lines:\n%s\nwant\n%s\nstdout %q", errb.String(), want, out.String())
	}
}

func TestPullRendererJSONAndQuiet(t *testing.T) {
	evs, _, _, info := pullEvents()
	var out, errb bytes.Buffer
	r := newPullRenderer(true, false, &out, &errb)
	for _, ev := range evs {
		r.event(ev)
	}
	if err := r.finish(info, nil); err != nil {
		t.Fatal(err)
	}
	got, img := pullJSON(t, out.String())
	if len(got) != len(evs) || img.Name != info.Name || img.Digest != info.Digest || errb.Len() != 0 {
		t.Fatalf("json: %+v %+v (stderr %q)", got, img, errb.String())
	}
	for i := range evs {
		if got[i] != evs[i] {
			t.Errorf("event %d: %+v, want %+v", i, got[i], evs[i])
		}
	}

	out.Reset()
	r = newPullRenderer(false, true, &out, &errb)
	for _, ev := range evs {
		r.event(ev)
	}
	if err := r.finish(info, nil); err != nil || out.String() != info.Name+"\n" || errb.Len() != 0 {
		t.Errorf("quiet: %v, stdout %q, stderr %q", err, out.String(), errb.String())
	}
	// A failure prints nothing of its own (main prints the error).
	out.Reset()
	boom := errors.New("boom")
	for _, r := range []pullRenderer{newPullRenderer(true, false, &out, &errb), newPullRenderer(false, true, &out, &errb), newPullRenderer(false, false, &out, &errb)} {
		if err := r.finish(sandbox.ImageInfo{}, boom); !errors.Is(err, boom) {
			t.Errorf("%T: finish: %v", r, err)
		}
	}
	if out.Len() != 0 || errb.Len() != 0 {
		t.Errorf("failed pulls printed %q %q", out.String(), errb.String())
	}
}

// TestInsecureHint: a pull refused for TLS names the flag to add, unless
// the registry is insecure already or the error says so; a daemon's names
// the daemon's flag.
func TestInsecureHint(t *testing.T) {
	const ref = "127.0.0.1:5000/tools/box:1"
	plain := &sandbox.ImagePullError{Ref: ref, Reason: sandbox.PullUnreachable, Message: `Get "https://127.0.0.1:5000/v2/": http: server gave HTTP response to HTTPS client`}
	selfSigned := &sandbox.ImagePullError{Ref: ref, Reason: sandbox.PullUnreachable, Message: "tls: failed to verify certificate: x509: certificate signed by unknown authority"}
	notFound := &sandbox.ImagePullError{Ref: ref, Reason: sandbox.PullNotFound, Message: "MANIFEST_UNKNOWN"}
	said := &sandbox.ImagePullError{Ref: ref, Reason: sandbox.PullUnreachable, Message: "plain HTTP: add 127.0.0.1:5000 to the insecure registries"}
	c := &cli{}
	for _, err := range []error{plain, selfSigned} {
		got := c.insecureHint(err, ref, nil)
		if !errors.Is(got, sandbox.ErrImagePull) || !strings.Contains(got.Error(), "add --insecure-registry 127.0.0.1:5000") {
			t.Errorf("hint of %v: %v", err, got)
		}
		if got := c.insecureHint(err, ref, []string{"127.0.0.1:5000"}); got != error(err) {
			t.Errorf("a hint for a registry insecure already: %v", got)
		}
	}
	for _, err := range []error{notFound, said} {
		if got := c.insecureHint(err, ref, nil); got != error(err) {
			t.Errorf("a hint for %v: %v", err, got)
		}
	}
	c.remote = &remote{url: "http://127.0.0.1:4242"}
	if got := c.insecureHint(plain, ref, nil); !strings.Contains(got.Error(), "start the daemon with --insecure-registry 127.0.0.1:5000") {
		t.Errorf("a daemon's hint: %v", got)
	}
}
