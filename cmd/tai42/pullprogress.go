package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/vbauerster/mpb/v8"
	"github.com/vbauerster/mpb/v8/decor"
	"golang.org/x/term"

	"github.com/tai42/sandbox"
)

// pullRenderer shows a pull's progress: event gets each event (from one
// goroutine at a time, in order); finish is called once the pull ended,
// with its image or its error, and prints the outcome.
type pullRenderer interface {
	event(sandbox.PullProgress)
	finish(info sandbox.ImageInfo, err error) error
}

// newPullRenderer picks how "tai42 image pull" shows progress: --json
// lines on stdout, --quiet the name alone, else bars on a terminal's
// stderr or a line per layer on another stderr. Every mode but --json
// ends with the image's name on stdout, for scripts.
func newPullRenderer(asJSON, quiet bool, stdout, stderr io.Writer) pullRenderer {
	switch {
	case asJSON:
		return &jsonPull{w: stdout}
	case quiet:
		return &quietPull{w: stdout}
	case isTerminal(stderr):
		return newBarPull(stdout, stderr)
	}
	return &linePull{out: stdout, w: stderr}
}

// isTerminal reports whether w is a terminal.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}

// shortLayer is a layer digest as docker shows one: its first 12 hex
// digits.
func shortLayer(d string) string {
	_, hex, ok := strings.Cut(d, ":")
	if !ok {
		hex = d
	}
	return hex[:min(12, len(hex))]
}

// pullTally counts a pull's layers from its events, for the summary.
type pullTally struct {
	fetched, existing int
	bytes             int64 // of the layers fetched, as the registry sent them
}

func (t *pullTally) count(ev sandbox.PullProgress) {
	switch ev.Status {
	case sandbox.PullLayerExists:
		t.existing++
	case sandbox.PullLayerDone:
		t.fetched++
		t.bytes += max(ev.Done, ev.Total)
	}
}

// summary is the last line of a pull shown to a person.
func (t *pullTally) summary(info sandbox.ImageInfo) string {
	s := "pulled " + info.Name
	if info.Digest != "" {
		s += " (" + info.Digest + ")"
	}
	return fmt.Sprintf("%s: %d layer(s) fetched (%s), %d already held", s, t.fetched, humanBytes(t.bytes), t.existing)
}

// jsonPull is --json: each event as PullProgress's JSON on a line of its
// own, then the image (the object "tai42 image ls --json" lists), the one
// line without a "status".
type jsonPull struct {
	w   io.Writer
	err error // the first write error; later events are dropped
}

func (p *jsonPull) line(v any) {
	if p.err != nil {
		return
	}
	b, err := json.Marshal(v)
	if err == nil {
		_, err = p.w.Write(append(b, '\n'))
	}
	p.err = err
}

func (p *jsonPull) event(ev sandbox.PullProgress) { p.line(ev) }

func (p *jsonPull) finish(info sandbox.ImageInfo, err error) error {
	if err != nil {
		return err
	}
	p.line(info)
	return outputErr(p.err)
}

// quietPull is --quiet: the image's name alone.
type quietPull struct{ w io.Writer }

func (quietPull) event(sandbox.PullProgress) {}

func (p *quietPull) finish(info sandbox.ImageInfo, err error) error {
	if err != nil {
		return err
	}
	return writeLines(p.w, info.Name)
}

// linePull is the progress on a stderr that is no terminal: a line per
// layer once it is held, then the summary; the name on stdout.
type linePull struct {
	out, w io.Writer
	tally  pullTally
}

func (p *linePull) event(ev sandbox.PullProgress) {
	p.tally.count(ev)
	switch ev.Status {
	case sandbox.PullResolved:
		fmt.Fprintf(p.w, "%s: resolved to %s\n", ev.Ref, ev.Digest)
	case sandbox.PullLayerExists:
		fmt.Fprintf(p.w, "%s: already held\n", shortLayer(ev.Layer))
	case sandbox.PullLayerDone:
		fmt.Fprintf(p.w, "%s: fetched %s\n", shortLayer(ev.Layer), humanBytes(max(ev.Done, ev.Total)))
	}
}

func (p *linePull) finish(info sandbox.ImageInfo, err error) error {
	if err != nil {
		return err
	}
	fmt.Fprintln(p.w, p.tally.summary(info))
	return writeLines(p.out, info.Name)
}

// barPull draws a bar per layer on a terminal (mpb redraws them in place):
// bytes fetched of its size and the speed, then "done" once unpacked;
// "already held" for a layer the store had.
type barPull struct {
	out   io.Writer
	w     io.Writer
	p     *mpb.Progress
	bars  map[string]*layerBar
	tally pullTally
}

// layerBar is one layer's bar and when its last fetching event came (for
// the speed).
type layerBar struct {
	bar  *mpb.Bar
	last time.Time
}

// newBarPull draws on w; opts are for tests (a buffer is no terminal).
func newBarPull(out, w io.Writer, opts ...mpb.ContainerOption) *barPull {
	opts = append([]mpb.ContainerOption{mpb.WithOutput(w), mpb.WithRefreshRate(150 * time.Millisecond)}, opts...)
	return &barPull{out: out, w: w, p: mpb.New(opts...), bars: map[string]*layerBar{}}
}

func (p *barPull) event(ev sandbox.PullProgress) {
	p.tally.count(ev)
	switch ev.Status {
	case sandbox.PullResolved:
		fmt.Fprintf(p.p, "%s: resolved to %s\n", ev.Ref, ev.Digest)
	case sandbox.PullLayerExists:
		p.layer(ev).bar.SetTotal(-1, true)
	case sandbox.PullLayerFetching:
		lb := p.layer(ev)
		if ev.Total > 0 {
			lb.bar.SetTotal(ev.Total, false)
		}
		// The speed is of the bytes between two events: the first has
		// no interval before it.
		now := time.Now()
		if lb.last.IsZero() {
			lb.bar.SetCurrent(ev.Done)
		} else {
			lb.bar.EwmaSetCurrent(ev.Done, now.Sub(lb.last))
		}
		lb.last = now
	case sandbox.PullLayerDone:
		lb := p.layer(ev)
		if n := max(ev.Done, ev.Total); n > 0 {
			lb.bar.SetCurrent(n)
		}
		lb.bar.SetTotal(-1, true)
	}
}

// layer is ev's layer's bar, added at its first event: a layer held
// already says so and has no counters.
func (p *barPull) layer(ev sandbox.PullProgress) *layerBar {
	if lb, ok := p.bars[ev.Layer]; ok {
		return lb
	}
	name := mpb.PrependDecorators(decor.Name(shortLayer(ev.Layer), decor.WCSyncSpaceR))
	lb := &layerBar{}
	if ev.Status == sandbox.PullLayerExists {
		lb.bar = p.p.New(0, mpb.NopStyle(), name, mpb.AppendDecorators(decor.Name("already held")))
	} else {
		// Total 0 at construction: the bar completes when the layer is
		// done (unpacked), not once its bytes are all fetched.
		lb.bar = p.p.AddBar(0, name, mpb.AppendDecorators(
			decor.Counters(decor.SizeB1024(0), "% .1f / % .1f", decor.WCSyncSpace),
			decor.OnCompleteOrOnAbort(decor.EwmaSpeed(decor.SizeB1024(0), "% .1f", 30, decor.WCSyncSpace), ""),
			decor.OnComplete(decor.Name(""), "done"),
		))
	}
	p.bars[ev.Layer] = lb
	return lb
}

func (p *barPull) finish(info sandbox.ImageInfo, err error) error {
	for _, lb := range p.bars {
		if !lb.bar.Completed() {
			lb.bar.Abort(false)
		}
	}
	p.p.Wait()
	if err != nil {
		return err
	}
	fmt.Fprintln(p.w, p.tally.summary(info))
	return writeLines(p.out, info.Name)
}
