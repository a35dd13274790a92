package main

import (
	"bytes"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tai42/sandbox"
)

// Operation names, the keys of the per-operation statistics.
const (
	opCreate      = "create"
	opDestroy     = "destroy"
	opExecEcho    = "exec_echo"
	opExecStdin   = "exec_stdin"
	opExecExit    = "exec_exit"
	opExecTimeout = "exec_timeout"
	opStream      = "stream"
	opStreamKill  = "stream_kill"
	opPut         = "put_file"
	opGet         = "get_file"
	opPutStream   = "put_file_from"
	opGetStream   = "open_file"
	opGetMissing  = "get_missing"
	opTouch       = "touch"
	opMarker      = "persist_check"
)

// Load parameters.
const (
	// execTimeout is the timeout of every exec but the one meant to time
	// out; opTimeout bounds every call (a call that takes longer is an
	// error of kind "deadline").
	execTimeout = 60 * time.Second
	opTimeout   = 2 * time.Minute
	// shortTimeout is the timeout of the exec meant to time out, a sleep of
	// longer.
	shortTimeout = 300 * time.Millisecond
	// maxFile is the largest file moved; maxExecStdin the largest stdin of
	// an exec; maxChunk the largest stdin write of an interactive exec.
	maxFile      = 256 << 10
	maxExecStdin = 16 << 10
	maxChunk     = 32 << 10
	// files is how many file names a session's files rotate through.
	files = 8
	// persistentShare is the share of recreated sessions that are
	// persistent (keyed by their worker: one live session per key).
	persistentShare = 0.2
	// sessionTTL is every session's ttl_seconds; the touches of the mix
	// keep a busy session alive.
	sessionTTL = 600
	// markerPath holds, in a persistent workspace, the generation that
	// last wrote it.
	markerPath = ".soak-generation"
)

// mix is the weight of each step a worker takes, one at a time at random.
var mix = []struct {
	weight int
	step   func(*worker) error
}{
	{20, (*worker).execEcho},
	{20, (*worker).execStdin},
	{5, (*worker).execExit},
	{12, (*worker).stream},
	{4, (*worker).streamKill},
	{12, (*worker).putGet},
	{8, (*worker).putGetStream},
	{2, (*worker).getMissing},
	{10, (*worker).touch},
	{1, (*worker).execTimesOut},
	{3, (*worker).recreate},
}

// opStats are one operation's counts and latencies.
type opStats struct {
	count     int
	latencies []time.Duration
}

// stats are a worker's counts (the worker's own: merged after the run).
type stats struct {
	ops    map[string]*opStats
	errors map[string]int    // by "op: kind"
	first  map[string]string // the first error of each "op: kind"
}

func newStats() *stats {
	return &stats{ops: map[string]*opStats{}, errors: map[string]int{}, first: map[string]string{}}
}

func (s *stats) merge(o *stats) {
	for k, v := range o.ops {
		m := s.ops[k]
		if m == nil {
			m = &opStats{}
			s.ops[k] = m
		}
		m.count += v.count
		m.latencies = append(m.latencies, v.latencies...)
	}
	for k, v := range o.errors {
		s.errors[k] += v
		if _, ok := s.first[k]; !ok {
			s.first[k] = o.first[k]
		}
	}
}

// load is the state shared by the workers.
type load struct {
	sb      sandbox.Sandbox
	image   string
	network sandbox.Network
	ops     atomic.Int64 // client calls completed
}

// worker keeps one session alive and loops over the mix.
type worker struct {
	l     *load
	id    int
	rng   *rand.Rand
	st    *stats
	sess  sandbox.Session
	key   string // the worker's persistent workspace key
	gen   int    // sessions this worker has created
	saved int    // the generation last written to its persistent workspace, 0 for none
}

// errMismatch is an answer that is not what the call should have given.
type errMismatch struct{ msg string }

func (e *errMismatch) Error() string { return e.msg }

func mismatch(format string, args ...any) error {
	return &errMismatch{msg: fmt.Sprintf(format, args...)}
}

// kind classifies an unexpected error for the counts.
func kind(err error) string {
	var mm *errMismatch
	var to *sandbox.ExecTimeoutError
	switch {
	case errors.As(err, &mm):
		return "wrong answer"
	case errors.Is(err, context.DeadlineExceeded):
		return "deadline"
	case errors.As(err, &to):
		return "exec timeout"
	case errors.Is(err, sandbox.ErrSessionNotFound):
		return "session not found"
	case errors.Is(err, sandbox.ErrFileNotFound):
		return "file not found"
	case errors.Is(err, sandbox.ErrSpecRejected):
		return "spec rejected"
	case errors.Is(err, sandbox.ErrOutputLimit):
		return "output limit"
	case errors.Is(err, sandbox.ErrSandbox):
		return "sandbox error"
	default:
		return "other"
	}
}

// call runs one client call as operation op: it counts it (and its
// latency), and on error counts the error by kind. fn's context is
// bounded by opTimeout and is not the run's: a call under way when the run
// ends is let finish.
func (w *worker) call(op string, fn func(ctx context.Context) error) error {
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	start := time.Now()
	err := fn(ctx)
	o := w.st.ops[op]
	if o == nil {
		o = &opStats{}
		w.st.ops[op] = o
	}
	o.count++
	o.latencies = append(o.latencies, time.Since(start))
	w.l.ops.Add(1)
	if err != nil {
		w.fail(op, err)
	}
	return err
}

// fail counts err as an unexpected error of op.
func (w *worker) fail(op string, err error) {
	k := op + ": " + kind(err)
	w.st.errors[k]++
	if _, ok := w.st.first[k]; !ok {
		w.st.first[k] = err.Error()
	}
}

// run loops over the mix until the run's ctx is done, then destroys its
// session. The workers' first steps are the mix's in turn, dealt out
// among the workers (worker i takes steps i, i+workers, ...), so that a
// short run on a loaded machine still takes every step at least once.
func (w *worker) run(ctx context.Context, pause time.Duration, workers int) {
	total := 0
	for _, m := range mix {
		total += m.weight
	}
	for next := w.id; ctx.Err() == nil; next += workers {
		if w.sess == nil {
			if err := w.create(); err != nil {
				sleepCtx(ctx, time.Second) // the error is counted; don't spin
				continue
			}
		}
		if next < len(mix) {
			_ = mix[next].step(w) // counted by call
		} else {
			r := w.rng.IntN(total)
			for _, m := range mix {
				if r < m.weight {
					_ = m.step(w)
					break
				}
				r -= m.weight
			}
		}
		if pause > 0 {
			sleepCtx(ctx, time.Duration(w.rng.Int64N(int64(2*pause))))
		}
	}
	if w.sess != nil {
		_ = w.destroy()
	}
}

func sleepCtx(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// create makes the worker's session: persistent (keyed by the worker) for
// persistentShare of them but the first, else ephemeral. A persistent
// session must find the generation its worker last wrote there.
func (w *worker) create() error {
	w.gen++
	persistent := w.gen > 1 && w.rng.Float64() < persistentShare
	spec := sandbox.SessionSpec{
		Image:      w.l.image,
		Durability: sandbox.Ephemeral,
		Network:    w.l.network,
		TTLSeconds: sessionTTL,
		Labels:     map[string]string{"soak": "1", "worker": strconv.Itoa(w.id)},
	}
	if persistent {
		spec.Durability, spec.WorkspaceKey = sandbox.Persistent, w.key
	}
	var s sandbox.Session
	err := w.call(opCreate, func(ctx context.Context) (err error) {
		s, err = w.l.sb.CreateSession(ctx, spec)
		return err
	})
	if err != nil {
		return err
	}
	w.sess = s
	if !persistent {
		return nil
	}
	return w.call(opMarker, func(ctx context.Context) error {
		b, err := s.GetFile(ctx, markerPath)
		switch {
		case w.saved == 0 && errors.Is(err, sandbox.ErrFileNotFound):
		case err != nil:
			return err
		case string(b) != strconv.Itoa(w.saved):
			return mismatch("persistent workspace %s: generation %q, want %d", w.key, b, w.saved)
		}
		if err := s.PutFile(ctx, markerPath, []byte(strconv.Itoa(w.gen))); err != nil {
			return err
		}
		w.saved = w.gen
		return nil
	})
}

// destroy destroys the worker's session; it is forgotten even when the
// destroy fails (the error is counted).
func (w *worker) destroy() error {
	s := w.sess
	w.sess = nil
	return w.call(opDestroy, func(ctx context.Context) error { return s.Destroy(ctx) })
}

func (w *worker) recreate() error {
	if err := w.destroy(); err != nil {
		return err
	}
	return w.create()
}

// text returns n random lowercase hex characters.
func (w *worker) text(n int) []byte {
	b := make([]byte, (n+1)/2)
	for i := range b {
		b[i] = byte(w.rng.Uint32())
	}
	return []byte(hex.EncodeToString(b)[:n])
}

func (w *worker) bytes(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(w.rng.Uint32())
	}
	return b
}

func checkResult(res sandbox.ExecResult, code int, stdout string) error {
	if res.ExitCode != code || res.Stdout != stdout || res.Stderr != "" {
		return mismatch("exit %d, stdout %d bytes, stderr %q; want exit %d, stdout %d bytes as sent, no stderr",
			res.ExitCode, len(res.Stdout), clip(res.Stderr), code, len(stdout))
	}
	return nil
}

func clip(s string) string {
	if len(s) > 200 {
		return s[:200] + "..."
	}
	return s
}

func (w *worker) execEcho() error {
	word := string(w.text(16))
	return w.call(opExecEcho, func(ctx context.Context) error {
		res, err := w.sess.Exec(ctx, []string{"echo", word}, sandbox.ExecOptions{Timeout: execTimeout})
		if err != nil {
			return err
		}
		return checkResult(res, 0, word+"\n")
	})
}

func (w *worker) execStdin() error {
	in := w.text(w.rng.IntN(maxExecStdin + 1))
	return w.call(opExecStdin, func(ctx context.Context) error {
		res, err := w.sess.Exec(ctx, []string{"cat"}, sandbox.ExecOptions{Stdin: in, Timeout: execTimeout})
		if err != nil {
			return err
		}
		return checkResult(res, 0, string(in))
	})
}

func (w *worker) execExit() error {
	code := 1 + w.rng.IntN(100)
	return w.call(opExecExit, func(ctx context.Context) error {
		res, err := w.sess.Exec(ctx, []string{"sh", "-c", "exit " + strconv.Itoa(code)}, sandbox.ExecOptions{Timeout: execTimeout})
		if err != nil {
			return err
		}
		return checkResult(res, code, "")
	})
}

// execTimesOut runs a sleep past its exec's timeout: the answer must be an
// *ExecTimeoutError, well before the sleep would have ended.
func (w *worker) execTimesOut() error {
	return w.call(opExecTimeout, func(ctx context.Context) error {
		start := time.Now()
		res, err := w.sess.Exec(ctx, []string{"sleep", "30"}, sandbox.ExecOptions{Timeout: shortTimeout})
		var to *sandbox.ExecTimeoutError
		switch {
		case errors.As(err, &to):
			if d := time.Since(start); d > 20*time.Second {
				return mismatch("the exec timed out after %v, %v after its %v timeout", d, d-shortTimeout, shortTimeout)
			}
			return nil
		case err != nil:
			return err
		default:
			return mismatch("sleep 30 with a %v timeout: exit %d, no timeout error", shortTimeout, res.ExitCode)
		}
	})
}

// readStream reads h to its end: the output, and the exit code (or the
// error that ended it). After the exit item Next must give io.EOF.
func readStream(ctx context.Context, h sandbox.ExecHandle, out *bytes.Buffer, seen func()) (int, error) {
	for {
		it, err := h.Next(ctx)
		if err != nil {
			if err == io.EOF {
				return 0, mismatch("the stream ended without an exit item")
			}
			return 0, err
		}
		switch it := it.(type) {
		case *sandbox.StreamChunk:
			if it.Stream != sandbox.Stdout {
				return 0, mismatch("output on %s: %q", it.Stream, clip(string(it.Data)))
			}
			out.Write(it.Data)
			if seen != nil {
				seen()
			}
		case *sandbox.StreamExit:
			if _, err := h.Next(ctx); err != io.EOF {
				return 0, mismatch("after the exit item Next gave %v, want io.EOF", err)
			}
			return it.ExitCode, nil
		default:
			return 0, mismatch("unknown stream item %T", it)
		}
	}
}

// stream is an interactive cat: stdin written in chunks while the output
// is read, then closed; the output must be the input and the exit 0.
func (w *worker) stream() error {
	var chunks [][]byte
	var in []byte
	for range 1 + w.rng.IntN(8) {
		c := w.bytes(1 + w.rng.IntN(maxChunk))
		chunks = append(chunks, c)
		in = append(in, c...)
	}
	return w.call(opStream, func(ctx context.Context) error {
		h, err := w.sess.ExecStart(ctx, []string{"cat"}, sandbox.StartOptions{Timeout: execTimeout})
		if err != nil {
			return err
		}
		defer killQuiet(h)
		var out bytes.Buffer
		var code int
		var rerr error
		var wg sync.WaitGroup
		wg.Go(func() { code, rerr = readStream(ctx, h, &out, nil) })
		werr := func() error {
			for _, c := range chunks {
				if err := h.WriteStdin(ctx, c); err != nil {
					return err
				}
			}
			return h.CloseStdin(ctx)
		}()
		if werr != nil {
			_ = h.Kill(ctx)
		}
		wg.Wait()
		switch {
		case werr != nil:
			return werr
		case rerr != nil:
			return rerr
		case code != 0 || !bytes.Equal(out.Bytes(), in):
			return mismatch("interactive cat: exit %d, %d bytes out; want exit 0 and the %d bytes in", code, out.Len(), len(in))
		}
		return nil
	})
}

// streamKill starts an interactive cat, waits for its echo of one write,
// kills it and reads the stream to its end: exit 137 (SIGKILL).
func (w *worker) streamKill() error {
	in := w.bytes(1 + w.rng.IntN(4096))
	return w.call(opStreamKill, func(ctx context.Context) error {
		h, err := w.sess.ExecStart(ctx, []string{"cat"}, sandbox.StartOptions{Timeout: execTimeout})
		if err != nil {
			return err
		}
		defer killQuiet(h)
		if err := h.WriteStdin(ctx, in); err != nil {
			return err
		}
		var out bytes.Buffer
		echoed := make(chan struct{})
		var once sync.Once
		var code int
		var rerr error
		done := make(chan struct{})
		go func() {
			defer close(done)
			code, rerr = readStream(ctx, h, &out, func() {
				if out.Len() >= len(in) {
					once.Do(func() { close(echoed) })
				}
			})
		}()
		select {
		case <-echoed:
		case <-done:
			if rerr != nil {
				return rerr
			}
			return mismatch("interactive cat ended (exit %d) before it was killed", code)
		}
		if err := h.Kill(ctx); err != nil {
			<-done
			return err
		}
		<-done
		switch {
		case rerr != nil:
			return rerr
		case code != 137:
			return mismatch("killed interactive cat: exit %d, want 137", code)
		case !bytes.Equal(out.Bytes(), in):
			return mismatch("killed interactive cat: %d bytes out, want the %d bytes in", out.Len(), len(in))
		}
		return nil
	})
}

// killQuiet kills h when a call is done with it (a no-op once the exec has
// exited; an error here is the call's own error's consequence, or shows
// in the next call).
func killQuiet(h sandbox.ExecHandle) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_ = h.Kill(ctx)
}

func (w *worker) filePath() string { return "soak/f" + strconv.Itoa(w.rng.IntN(files)) + ".bin" }

// putGet writes a file of up to maxFile random bytes and reads it back.
func (w *worker) putGet() error {
	data, path := w.bytes(w.rng.IntN(maxFile+1)), w.filePath()
	if err := w.call(opPut, func(ctx context.Context) error { return w.sess.PutFile(ctx, path, data) }); err != nil {
		return err
	}
	return w.call(opGet, func(ctx context.Context) error {
		got, err := w.sess.GetFile(ctx, path)
		if err != nil {
			return err
		}
		if !bytes.Equal(got, data) {
			return mismatch("get_file %s: %d bytes, not the %d put", path, len(got), len(data))
		}
		return nil
	})
}

// putGetStream is putGet through sandbox.FileStreamer (PutFileFrom and
// OpenFile), which the client's sessions implement.
func (w *worker) putGetStream() error {
	fs, ok := w.sess.(sandbox.FileStreamer)
	if !ok {
		w.fail(opPutStream, mismatch("the client's session %T does not implement sandbox.FileStreamer", w.sess))
		return nil
	}
	data, path := w.bytes(w.rng.IntN(maxFile+1)), w.filePath()
	if err := w.call(opPutStream, func(ctx context.Context) error {
		return fs.PutFileFrom(ctx, path, bytes.NewReader(data))
	}); err != nil {
		return err
	}
	return w.call(opGetStream, func(ctx context.Context) error {
		rc, size, err := fs.OpenFile(ctx, path)
		if err != nil {
			return err
		}
		defer rc.Close()
		got, err := io.ReadAll(rc)
		if err != nil {
			return err
		}
		if size != int64(len(data)) || !bytes.Equal(got, data) {
			return mismatch("open_file %s: size %d, %d bytes read, not the %d put", path, size, len(got), len(data))
		}
		return nil
	})
}

// getMissing reads a file that does not exist: *FileNotFoundError.
func (w *worker) getMissing() error {
	return w.call(opGetMissing, func(ctx context.Context) error {
		_, err := w.sess.GetFile(ctx, "soak/missing")
		switch {
		case errors.Is(err, sandbox.ErrFileNotFound):
			return nil
		case err != nil:
			return err
		}
		return mismatch("get_file of a missing file succeeded")
	})
}

func (w *worker) touch() error {
	return w.call(opTouch, func(ctx context.Context) error { return w.sess.Touch(ctx) })
}

// percentile returns the p-th percentile (0 < p ≤ 1) of d, sorting d.
func percentile(d []time.Duration, p float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	slices.Sort(d)
	i := int(float64(len(d))*p+0.5) - 1
	return d[min(max(i, 0), len(d)-1)]
}
