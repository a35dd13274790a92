package server

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tai42/sandbox"
	"github.com/tai42/sandbox/api"
	"github.com/tai42/sandbox/kit"
)

// fakeImages serves a kit sandbox whose image calls it answers itself. A
// pull reports events (from a goroutine of its own, as a provider may),
// then, when hold is set, waits for its context to end and sends the
// context's error on cancelled; it then returns pulled or pullErr.
type fakeImages struct {
	*kit.Sandbox
	mu        sync.Mutex
	events    []sandbox.PullProgress
	pulled    sandbox.ImageInfo
	pullErr   error
	hold      bool
	cancelled chan error
	returned  chan struct{} // closed once the events are reported, when set
	list      []sandbox.ImageInfo
	rmErr     error
	pruned    sandbox.PruneResult
	asked     []string
	platform  string
}

var _ sandbox.ImageManager = (*fakeImages)(nil)

func (f *fakeImages) PullImage(ctx context.Context, ref string, opts sandbox.PullOptions) (sandbox.ImageInfo, error) {
	f.mu.Lock()
	f.asked = append(f.asked, "pull "+ref)
	f.platform = opts.Platform
	events, pulled, pullErr, hold, returned := f.events, f.pulled, f.pullErr, f.hold, f.returned
	f.mu.Unlock()
	done := make(chan struct{})
	go func() {
		defer close(done)
		for _, ev := range events {
			opts.Progress(ev)
		}
	}()
	<-done
	if returned != nil {
		close(returned)
	}
	if hold {
		select { // bounded: a pull that is never cancelled fails the test rather than hanging it
		case <-ctx.Done():
		case <-time.After(20 * time.Second):
		}
		f.cancelled <- ctx.Err()
		return sandbox.ImageInfo{}, ctx.Err()
	}
	return pulled, pullErr
}

func (f *fakeImages) ListImages(context.Context) ([]sandbox.ImageInfo, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.asked = append(f.asked, "list")
	return f.list, nil
}

func (f *fakeImages) RemoveImage(_ context.Context, name string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.asked = append(f.asked, "rm "+name)
	return f.rmErr
}

func (f *fakeImages) PruneImages(context.Context) (sandbox.PruneResult, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.asked = append(f.asked, "prune")
	return f.pruned, nil
}

func (f *fakeImages) set(fn func(f *fakeImages)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	fn(f)
	f.asked = nil
}

func (f *fakeImages) calls() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.asked...)
}

func newImagesEnv(t *testing.T) (*env, *fakeImages) {
	base := newEnv(t)
	f := &fakeImages{Sandbox: base.sb, cancelled: make(chan error, 1)}
	return newEnvOn(t, base.sb, f), f
}

var (
	pulledAt = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	pyImage  = sandbox.ImageInfo{Name: "python:3.12-slim", ID: "sha256:c0", Digest: "sha256:d1", Platform: "linux/arm64",
		Size: 130 << 20, SharedSize: 30 << 20, Layers: 4, Pulled: pulledAt}
	pyEvents = []sandbox.PullProgress{
		{Ref: "python:3.12-slim", Status: sandbox.PullResolved, Digest: "sha256:d1"},
		{Ref: "python:3.12-slim", Status: sandbox.PullLayerExists, Layer: "sha256:l0"},
		{Ref: "python:3.12-slim", Status: sandbox.PullLayerFetching, Layer: "sha256:l1", Done: 1 << 20, Total: 3 << 20},
		{Ref: "python:3.12-slim", Status: sandbox.PullLayerFetching, Layer: "sha256:l1", Done: 3 << 20, Total: 3 << 20},
		{Ref: "python:3.12-slim", Status: sandbox.PullLayerDone, Layer: "sha256:l1"},
		{Ref: "python:3.12-slim", Status: sandbox.PullComplete, Digest: "sha256:d1"},
	}
)

// pullLines posts a pull and returns the response's status, content type
// and lines.
func (e *env) pullLines(body string) (int, string, []string) {
	e.t.Helper()
	resp := e.req("POST", "/v1/images/pull", strings.NewReader(body), testToken)
	defer resp.Body.Close()
	var lines []string
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		lines = append(lines, sc.Text())
	}
	if err := sc.Err(); err != nil {
		e.t.Fatalf("reading the pull's answer: %v", err)
	}
	return resp.StatusCode, resp.Header.Get("Content-Type"), lines
}

// checkEvents checks the stream's event lines against the events the pull
// reported: every event in order, but that a "fetching" event waiting for
// the client may have been replaced, in its place, by a later one of its
// layer. So: the events other than "fetching" come all and in order; each
// layer's events come in order, its "fetching" events a subsequence of
// those sent that keeps the last before each other event of the layer.
func checkEvents(t *testing.T, lines []string, sent []sandbox.PullProgress) {
	t.Helper()
	var got []sandbox.PullProgress
	for _, l := range lines {
		var ev sandbox.PullProgress
		if err := decodeStrict([]byte(l), &ev); err != nil {
			t.Fatalf("an event line %s: %v", l, err)
		}
		got = append(got, ev)
	}
	others := func(evs []sandbox.PullProgress) (out []sandbox.PullProgress) {
		for _, ev := range evs {
			if ev.Status != sandbox.PullLayerFetching {
				out = append(out, ev)
			}
		}
		return out
	}
	if g, w := others(got), others(sent); !slices.Equal(g, w) {
		t.Fatalf("the stream's events other than fetching: %+v; want %+v", g, w)
	}
	byLayer := func(evs []sandbox.PullProgress) map[string][]sandbox.PullProgress {
		m := map[string][]sandbox.PullProgress{}
		for _, ev := range evs {
			if ev.Layer != "" {
				m[ev.Layer] = append(m[ev.Layer], ev)
			}
		}
		return m
	}
	gotBy := byLayer(got)
	for layer, want := range byLayer(sent) {
		g := gotBy[layer]
		i := 0 // the next of g to find in want
		for j, ev := range want {
			kept := i < len(g) && g[i] == ev
			if kept {
				i++
			}
			lastFetch := ev.Status == sandbox.PullLayerFetching && (j+1 == len(want) || want[j+1].Status != sandbox.PullLayerFetching)
			if !kept && (ev.Status != sandbox.PullLayerFetching || lastFetch) {
				t.Fatalf("layer %s: event %d of %d, %+v, is not in the stream where it belongs", layer, j, len(want), ev)
			}
		}
		if i != len(g) {
			t.Fatalf("layer %s: the stream has %+v, out of order or never sent", layer, g[i])
		}
	}
}

// The pull's answer: every event in order, one JSON object a line, then
// the image; the reference and the platform reach the sandbox.
func TestPullStream(t *testing.T) {
	e, f := newImagesEnv(t)
	f.set(func(f *fakeImages) { f.events, f.pulled = pyEvents, pyImage })
	status, ct, lines := e.pullLines(`{"ref":"python:3.12-slim","platform":"linux/arm64"}`)
	if status != http.StatusOK || ct != api.ContentTypeNDJSON {
		t.Fatalf("pull: %d %q; want 200 %s", status, ct, api.ContentTypeNDJSON)
	}
	checkEvents(t, lines[:len(lines)-1], pyEvents)
	var end api.PullEnd
	if err := decodeStrict([]byte(lines[len(lines)-1]), &end); err != nil || end.Error != nil || end.Image == nil || *end.Image != pyImage {
		t.Errorf("the last line %s (%v); want {\"image\": %+v}", lines[len(lines)-1], err, pyImage)
	}
	if got := f.calls(); len(got) != 1 || got[0] != "pull python:3.12-slim" || f.platform != "linux/arm64" {
		t.Errorf("the sandbox was asked %v, platform %q", got, f.platform)
	}
	// A pull with no event (the image was there whole) is the end line alone.
	f.set(func(f *fakeImages) { f.events = nil })
	if status, _, lines := e.pullLines(`{"ref":"python:3.12-slim"}`); status != http.StatusOK || len(lines) != 1 || !strings.HasPrefix(lines[0], `{"image":{"name":"python:3.12-slim"`) {
		t.Errorf("a pull without events: %d %q", status, lines)
	}
	if f.platform != "" {
		t.Errorf("no platform given, the sandbox got %q", f.platform)
	}
}

// A pull that fails after its first event ends the stream with the error
// line, which maps back to the same error; one that fails before any is a
// plain error response with its kind's status.
func TestPullErrors(t *testing.T) {
	e, f := newImagesEnv(t)
	mid := &sandbox.ImagePullError{Ref: "127.0.0.1:5000/r@sha256:0d", Reason: sandbox.PullInvalidImage, Message: "layer sha256:l1: digest mismatch"}
	f.set(func(f *fakeImages) { f.events, f.pullErr = pyEvents[:3], mid })
	status, _, lines := e.pullLines(`{"ref":"127.0.0.1:5000/r@sha256:0d"}`)
	if status != http.StatusOK || len(lines) < 2 {
		t.Fatalf("a pull failing midway: %d %q; want 200, its events and the end", status, lines)
	}
	checkEvents(t, lines[:len(lines)-1], pyEvents[:3])
	var end api.PullEnd
	if err := decodeStrict([]byte(lines[len(lines)-1]), &end); err != nil || end.Image != nil || end.Error == nil {
		t.Fatalf("the last line %s (%v); want an error", lines[len(lines)-1], err)
	}
	if end.Error.Kind != api.KindImagePull || end.Error.Reason != "invalid_image" || end.Error.Ref != mid.Ref || end.Error.Op != "pull_image" {
		t.Errorf("the error line %+v; want image_pull, invalid_image, its ref, op pull_image", *end.Error)
	}
	if back := end.Error.Err(); !reflect.DeepEqual(back, error(mid)) {
		t.Errorf("the error line maps back to %#v; want %#v", back, mid)
	}

	// Before any event: a plain 400 image_pull carrying the reason.
	bad := &sandbox.ImagePullError{Ref: "Not A Ref", Reason: sandbox.PullInvalidReference, Message: "could not parse reference"}
	f.set(func(f *fakeImages) { f.events, f.pullErr = nil, bad })
	er := e.callErr("POST", "/v1/images/pull", `{"ref":"Not A Ref"}`, http.StatusBadRequest, api.KindImagePull)
	if er.Reason != "invalid_reference" || er.Ref != "Not A Ref" || !reflect.DeepEqual(er.Err(), error(bad)) {
		t.Errorf("an invalid reference: %+v", er)
	}
	// Any other error of the family keeps its kind, before or after.
	f.set(func(f *fakeImages) { f.pullErr = sandbox.Errorf("pull_image", "provider host keeps no images") })
	if er := e.callErr("POST", "/v1/images/pull", `{"ref":"a"}`, http.StatusBadRequest, api.KindSandbox); er.Op != "pull_image" {
		t.Errorf("a sandbox error before the stream: %+v", er)
	}
	f.set(func(f *fakeImages) { f.events, f.pullErr = pyEvents[:1], errors.New("a bug") })
	if _, _, lines := e.pullLines(`{"ref":"a"}`); len(lines) != 2 || !strings.Contains(lines[1], `"kind":"internal"`) {
		t.Errorf("a foreign error midway: %q; want the event, then an internal error line", lines)
	}

	// A malformed body is refused before the sandbox is asked.
	f.set(func(*fakeImages) {})
	for _, body := range []string{``, `[]`, `{"ref":"a","extra":1}`, `{"Ref":"a"}`, `{"ref":1}`, `{"ref":"a"} {}`, `{"ref":"a","ref":"b"}`} {
		e.callErr("POST", "/v1/images/pull", body, http.StatusBadRequest, api.KindBadRequest)
	}
	if got := f.calls(); len(got) != 0 {
		t.Errorf("malformed bodies reached the sandbox: %v", got)
	}
	// The body is a JSON body, under the JSON limit.
	e.call("POST", "/v1/images/pull", `{"ref":"`+strings.Repeat("a", int(maxJSONBytes))+`"}`, http.StatusRequestEntityTooLarge, nil)
}

// A client that does not read holds up no pull: the events of a layer it
// has not taken merge into the latest, and it gets them all once it reads.
func TestPullSlowClient(t *testing.T) {
	e, f := newImagesEnv(t)
	const n = 200000 // ~20 MB of lines: more than the sockets hold
	evs := []sandbox.PullProgress{{Ref: "r", Status: sandbox.PullResolved, Digest: "sha256:d"}}
	for i := 1; i <= n; i++ {
		evs = append(evs, sandbox.PullProgress{Ref: "r", Status: sandbox.PullLayerFetching, Layer: "sha256:" + strconv.Itoa(i%2), Done: int64(i), Total: n + 1})
	}
	evs = append(evs, sandbox.PullProgress{Ref: "r", Status: sandbox.PullLayerDone, Layer: "sha256:0"},
		sandbox.PullProgress{Ref: "r", Status: sandbox.PullLayerDone, Layer: "sha256:1"},
		sandbox.PullProgress{Ref: "r", Status: sandbox.PullComplete, Digest: "sha256:d"})
	returned := make(chan struct{})
	f.set(func(f *fakeImages) { f.events, f.pulled, f.returned = evs, sandbox.ImageInfo{Name: "r"}, returned })
	resp := e.req("POST", "/v1/images/pull", strings.NewReader(`{"ref":"r"}`), testToken)
	defer resp.Body.Close()
	select {
	case <-returned:
	case <-time.After(20 * time.Second):
		t.Fatal("the pull's events waited for a client that does not read")
	}
	var lines []string
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		lines = append(lines, sc.Text())
	}
	if len(lines) < 6 || !strings.HasPrefix(lines[len(lines)-1], `{"image":{"name":"r"`) {
		t.Fatalf("the stream: %d lines ending %q", len(lines), lines[len(lines)-1])
	}
	checkEvents(t, lines[:len(lines)-1], evs)
}

// A client that goes away cancels the pull.
func TestPullCancelledWhenTheClientGoes(t *testing.T) {
	e, f := newImagesEnv(t)
	f.set(func(f *fakeImages) { f.events, f.hold = pyEvents[:1], true })
	resp := e.req("POST", "/v1/images/pull", strings.NewReader(`{"ref":"python:3.12-slim"}`), testToken)
	line, err := bufio.NewReader(resp.Body).ReadString('\n')
	if err != nil || !strings.Contains(line, `"status":"resolved"`) {
		t.Fatalf("the first line %q, %v", line, err)
	}
	select {
	case err := <-f.cancelled:
		t.Fatalf("the pull ended (%v) while its client was there", err)
	case <-time.After(200 * time.Millisecond):
	}
	resp.Body.Close() // unread: the transport closes the connection
	select {
	case err := <-f.cancelled:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("the pull's context ended with %v; want context.Canceled", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the pull was not cancelled 10 s after its client went away")
	}
}

// Listing, removal by names holding '/', ':' and '@', prune; an unknown
// name is 404 image_not_found.
func TestImageRoutes(t *testing.T) {
	e, f := newImagesEnv(t)
	b := e.call("GET", "/v1/images", nil, http.StatusOK, nil)
	if strings.TrimSpace(string(b)) != `{"images":[]}` {
		t.Errorf("an empty list: %s", b)
	}
	f.set(func(f *fakeImages) {
		f.list = []sandbox.ImageInfo{pyImage, {Name: "x:1", ID: "sha256:e", Platform: "linux/amd64", Pulled: pulledAt}}
	})
	var list api.ImageList
	e.call("GET", "/v1/images", nil, http.StatusOK, &list)
	if len(list.Images) != 2 || list.Images[0] != pyImage || list.Images[1].Name != "x:1" {
		t.Errorf("GET /v1/images: %+v", list)
	}
	want := `{"name":"x:1","id":"sha256:e","platform":"linux/amd64","size":0,"shared_size":0,"layers":0,"pulled":"2026-01-02T03:04:05Z"}`
	if !strings.Contains(string(e.call("GET", "/v1/images", nil, http.StatusOK, nil)), want) {
		t.Errorf("an image imported without a digest is not %s on the wire", want)
	}

	f.set(func(*fakeImages) {})
	for path, name := range map[string]string{
		"/v1/images/ghcr.io/o/r:tag": "ghcr.io/o/r:tag",
		"/v1/images/127.0.0.1:5000/r@sha256:9f1c5891b5b522d5df086d0ff0b110fbd9d21bb4fc7163af34d08286a2e846f6": "127.0.0.1:5000/r@sha256:9f1c5891b5b522d5df086d0ff0b110fbd9d21bb4fc7163af34d08286a2e846f6",
		"/v1/images/ghcr.io/o/r%3Atag": "ghcr.io/o/r:tag",
		"/v1/images/pull":              "pull", // an image may be called so: DELETE is the removal
		"/v1/images/python:3.12-slim":  "python:3.12-slim",
	} {
		f.set(func(*fakeImages) {})
		e.call("DELETE", path, nil, http.StatusNoContent, nil)
		if got := f.calls(); len(got) != 1 || got[0] != "rm "+name {
			t.Errorf("DELETE %s asked the sandbox %v; want rm %s", path, got, name)
		}
	}
	f.set(func(f *fakeImages) { f.rmErr = &sandbox.ImageNotFoundError{Name: "ghcr.io/o/gone:1"} })
	er := e.callErr("DELETE", "/v1/images/ghcr.io/o/gone:1", nil, http.StatusNotFound, api.KindImageNotFound)
	if er.Image != "ghcr.io/o/gone:1" || er.Op != "remove_image" || !reflect.DeepEqual(er.Err(), f.rmErr) {
		t.Errorf("image_not_found: %+v", er)
	}
	f.set(func(f *fakeImages) {
		f.rmErr = sandbox.Errorf("remove_image", "image %q is used by live session sb-7", "x:1")
	})
	if er := e.callErr("DELETE", "/v1/images/x:1", nil, http.StatusBadRequest, api.KindSandbox); !strings.Contains(er.Message, "sb-7") {
		t.Errorf("an image in use: %+v", er)
	}

	// No name: refused without asking the sandbox (DELETE /v1/images is
	// redirected there by net/http, as the root of the {name...} subtree).
	f.set(func(*fakeImages) {})
	for _, path := range []string{"/v1/images/", "/v1/images"} {
		if er := e.callErr("DELETE", path, nil, http.StatusBadRequest, api.KindSandbox); er.Op != "remove_image" || !strings.Contains(er.Message, "name") {
			t.Errorf("DELETE %s: %+v; want a remove_image error asking for a name", path, er)
		}
	}
	if got := f.calls(); len(got) != 0 {
		t.Errorf("a removal without a name asked the sandbox %v", got)
	}

	f.set(func(f *fakeImages) { f.pruned = sandbox.PruneResult{Layers: 3, Bytes: 12345} })
	var pr sandbox.PruneResult
	e.call("POST", "/v1/images/prune", nil, http.StatusOK, &pr)
	if pr != f.pruned {
		t.Errorf("POST /v1/images/prune = %+v; want %+v", pr, f.pruned)
	}

	// Other methods: 405 with what the path allows.
	for _, c := range []struct{ method, path, allow string }{
		{"GET", "/v1/images/pull", "POST, DELETE"},
		{"PUT", "/v1/images/ghcr.io/o/r:tag", "DELETE"},
		{"PUT", "/v1/images", "GET, HEAD, DELETE"}, // DELETE: redirected to /v1/images/, which asks for a name
		{"GET", "/v1/images/prune", "DELETE, POST"},
	} {
		resp := e.req(c.method, c.path, nil, testToken)
		resp.Body.Close()
		if resp.StatusCode != http.StatusMethodNotAllowed || resp.Header.Get("Allow") != c.allow {
			t.Errorf("%s %s: %d Allow %q; want 405 %q", c.method, c.path, resp.StatusCode, resp.Header.Get("Allow"), c.allow)
		}
	}
}

// Without the token nothing is asked of the sandbox.
func TestImageRoutesNeedTheToken(t *testing.T) {
	e, f := newImagesEnv(t)
	f.set(func(f *fakeImages) { f.events, f.pulled = pyEvents, pyImage })
	for _, c := range []struct{ method, path, body string }{
		{"POST", "/v1/images/pull", `{"ref":"python:3.12-slim"}`},
		{"GET", "/v1/images", ""},
		{"DELETE", "/v1/images/ghcr.io/o/r:tag", ""},
		{"POST", "/v1/images/prune", ""},
	} {
		for _, tok := range []string{"", "wrong"} {
			resp := e.req(c.method, c.path, strings.NewReader(c.body), tok)
			var eb api.ErrorBody
			_ = json.NewDecoder(resp.Body).Decode(&eb)
			resp.Body.Close()
			if resp.StatusCode != http.StatusUnauthorized || eb.Error.Kind != api.KindUnauthorized || resp.Header.Get("WWW-Authenticate") != "Bearer" {
				t.Errorf("%s %s with token %q: %d %+v", c.method, c.path, tok, resp.StatusCode, eb.Error)
			}
		}
	}
	if got := f.calls(); len(got) != 0 {
		t.Errorf("refused requests asked the sandbox %v", got)
	}
}

// On a kit sandbox of the host runner: no images, and pull, remove and
// prune say the provider keeps none. A sandbox without ImageManager says
// it does not manage images.
func TestImagesOnHost(t *testing.T) {
	e := newEnv(t)
	var list api.ImageList
	e.call("GET", "/v1/images", nil, http.StatusOK, &list)
	if list.Images == nil || len(list.Images) != 0 {
		t.Errorf("GET /v1/images on the host runner: %+v", list)
	}
	for _, c := range []struct{ method, path, body, op string }{
		{"POST", "/v1/images/pull", `{"ref":"python:3.12-slim"}`, "pull_image"},
		{"DELETE", "/v1/images/python:3.12-slim", "", "remove_image"},
		{"POST", "/v1/images/prune", "", "prune_images"},
	} {
		er := e.callErr(c.method, c.path, c.body, http.StatusBadRequest, api.KindSandbox)
		if er.Op != c.op || !strings.Contains(er.Message, "provider host keeps no images") {
			t.Errorf("%s %s: %+v; want op %s saying provider host keeps no images", c.method, c.path, er, c.op)
		}
	}

	plain := newEnvOn(t, e.sb, struct{ sandbox.Sandbox }{e.sb})
	for _, c := range []struct{ method, path, body, op string }{
		{"POST", "/v1/images/pull", `{"ref":"a"}`, "pull_image"},
		{"GET", "/v1/images", "", "list_images"},
		{"DELETE", "/v1/images/a", "", "remove_image"},
		{"POST", "/v1/images/prune", "", "prune_images"},
	} {
		er := plain.callErr(c.method, c.path, c.body, http.StatusBadRequest, api.KindSandbox)
		if er.Op != c.op || !strings.Contains(er.Message, "does not manage images") || !strings.Contains(er.Message, "host") {
			t.Errorf("%s %s on a sandbox without ImageManager: %+v", c.method, c.path, er)
		}
	}
}

// Each pull counts once, by its result.
func TestPullMetrics(t *testing.T) {
	e, f := newImagesEnv(t)
	before := e.scrape()
	for _, name := range []string{`result="ok"`, `result="not_found"`, `result="invalid_reference"`, `result="other"`} {
		if v, ok := before["tai42_image_pulls_total{"+name+"}"]; !ok || v != 0 {
			t.Errorf("tai42_image_pulls_total{%s} before any pull: %v, %v; want 0", name, v, ok)
		}
	}
	f.set(func(f *fakeImages) { f.events, f.pulled = pyEvents, pyImage })
	e.pullLines(`{"ref":"python:3.12-slim"}`)
	e.pullLines(`{"ref":"python:3.12-slim"}`)
	f.set(func(f *fakeImages) {
		f.events, f.pullErr = nil, &sandbox.ImagePullError{Ref: "x", Reason: sandbox.PullNotFound, Message: "MANIFEST_UNKNOWN"}
	})
	e.pullLines(`{"ref":"x"}`)
	after := e.scrape()
	if after[`tai42_image_pulls_total{result="ok"}`] != 2 || after[`tai42_image_pulls_total{result="not_found"}`] != 1 {
		t.Errorf("after 2 pulls and 1 not found: ok %v, not_found %v",
			after[`tai42_image_pulls_total{result="ok"}`], after[`tai42_image_pulls_total{result="not_found"}`])
	}
	// The failure came before any event: a plain 400.
	if after[`tai42_http_requests_total{code="200",route="pullImage"}`] != 2 || after[`tai42_http_requests_total{code="400",route="pullImage"}`] != 1 {
		t.Errorf("pullImage requests counted 200: %v, 400: %v; want 2, 1",
			after[`tai42_http_requests_total{code="200",route="pullImage"}`], after[`tai42_http_requests_total{code="400",route="pullImage"}`])
	}
}
