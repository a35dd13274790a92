package mcpserver

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/google/jsonschema-go/jsonschema"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/tai42/sandbox"
)

// Encodings of text fields that may carry bytes.
const (
	encText   = "text"
	encBase64 = "base64"
	encAuto   = "auto"
)

// commandIn is how a command is given: argv, or a shell command line.
type commandIn struct {
	Argv    []string `json:"argv,omitempty" jsonschema:"the command and its arguments, run directly (no shell); give this or command"`
	Command string   `json:"command,omitempty" jsonschema:"a shell command line, run as sh -c COMMAND; give this or argv"`
}

func (c commandIn) argv() ([]string, error) {
	switch {
	case len(c.Argv) > 0 && c.Command != "":
		return nil, errors.New("give argv or command, not both")
	case len(c.Argv) > 0:
		return c.Argv, nil
	case c.Command != "":
		return []string{"sh", "-c", c.Command}, nil
	}
	return nil, errors.New("give argv (the command and its arguments) or command (a shell command line)")
}

type createIn struct {
	Image      string            `json:"image,omitempty" jsonschema:"the image the session runs (default: the server's, usually host)"`
	Network    string            `json:"network,omitempty" jsonschema:"none (loopback only, the default), internal (this host's sessions) or egress (the internet, without private ranges)"`
	Isolation  string            `json:"isolation,omitempty" jsonschema:"none, container or vm (default: the provider's own)"`
	CPU        float64           `json:"cpu,omitempty" jsonschema:"cap the session at this many CPUs (default: no cap)"`
	MemoryMB   int               `json:"memory_mb,omitempty" jsonschema:"cap the session's memory in MiB (default: no cap)"`
	TTLSeconds int               `json:"ttl_seconds,omitempty" jsonschema:"the session's life in seconds, renewed by touch (default: 1800)"`
	Persistent string            `json:"persistent,omitempty" jsonschema:"make the session persistent with this workspace key: its files outlive it, and it is not destroyed when this connection ends"`
	Labels     map[string]string `json:"labels,omitempty" jsonschema:"your own tags, returned by list_sessions"`
	Env        map[string]string `json:"env,omitempty" jsonschema:"the session's environment for every command (values are secrets: never shown back)"`
}

type sessionOut struct {
	SessionID      string            `json:"session_id"`
	Image          string            `json:"image"`
	WorkspacePath  string            `json:"workspace_path"`
	WorkspaceKey   string            `json:"workspace_key,omitempty"`
	Durability     string            `json:"durability"`
	CreatedAt      time.Time         `json:"created_at"`
	ExpiresAt      time.Time         `json:"expires_at"`
	Labels         map[string]string `json:"labels,omitempty"`
	ThisConnection bool              `json:"this_connection,omitempty"`
}

// createOut is create_session's result: the session, and how it is
// isolated, so that the agent knows whether it has a sandbox at all.
type createOut struct {
	sessionOut
	Isolation string `json:"isolation" jsonschema:"none (no sandbox: the commands run on the user's machine as the server's user), container or vm; unknown when the server does not know"`
	Network   string `json:"network" jsonschema:"none (loopback only), internal or egress"`
}

func sessionOutOf(info sandbox.SessionInfo, connID string) sessionOut {
	return sessionOut{SessionID: info.ID, Image: info.Image, WorkspacePath: info.WorkspacePath,
		WorkspaceKey: info.WorkspaceKey, Durability: string(info.Durability), CreatedAt: info.CreatedAt,
		ExpiresAt: info.ExpiresAt, Labels: info.Labels, ThisConnection: connID != "" && info.Labels[LabelConnection] == connID}
}

type sessionIn struct {
	SessionID string `json:"session_id" jsonschema:"the session's id, from create_session"`
}

type runIn struct {
	SessionID string `json:"session_id" jsonschema:"the session's id, from create_session"`
	commandIn
	Cwd            string            `json:"cwd,omitempty" jsonschema:"working directory, relative to the workspace (default: the workspace); it must exist"`
	Env            map[string]string `json:"env,omitempty" jsonschema:"environment overlaid on the session's (values are secrets: never shown back)"`
	Stdin          string            `json:"stdin,omitempty" jsonschema:"the command's whole standard input (default: empty)"`
	StdinEncoding  string            `json:"stdin_encoding,omitempty" jsonschema:"text (the default) or base64"`
	TimeoutSeconds float64           `json:"timeout_seconds,omitempty" jsonschema:"kill the command after this many seconds (default: the sandbox's exec default, usually 60)"`
}

type runOut struct {
	ExitCode       int    `json:"exit_code"`
	Stdout         string `json:"stdout"`
	Stderr         string `json:"stderr"`
	StdoutEncoding string `json:"stdout_encoding,omitempty"`
	StderrEncoding string `json:"stderr_encoding,omitempty"`
	StdoutBytes    int    `json:"stdout_bytes"`
	StderrBytes    int    `json:"stderr_bytes"`
	Truncated      bool   `json:"truncated,omitempty"`
	StdoutFile     string `json:"stdout_file,omitempty"`
	StderrFile     string `json:"stderr_file,omitempty"`
	Note           string `json:"note,omitempty"`
}

type writeIn struct {
	SessionID string `json:"session_id" jsonschema:"the session's id, from create_session"`
	Path      string `json:"path" jsonschema:"the file's path, relative to the workspace; missing parent directories are made and an existing file is replaced"`
	Content   string `json:"content" jsonschema:"the file's whole content"`
	Encoding  string `json:"encoding,omitempty" jsonschema:"text (the default) or base64, for binary content"`
}

type writeOut struct {
	Path  string `json:"path"`
	Bytes int    `json:"bytes"`
}

type readIn struct {
	SessionID string `json:"session_id" jsonschema:"the session's id, from create_session"`
	Path      string `json:"path" jsonschema:"the file's path, relative to the workspace"`
	Offset    int64  `json:"offset,omitempty" jsonschema:"the first byte to read (default: 0)"`
	Length    int    `json:"length,omitempty" jsonschema:"the most bytes to read (default and cap: the server's result limit)"`
	Encoding  string `json:"encoding,omitempty" jsonschema:"auto (the default: text when the bytes are UTF-8, else base64), text or base64"`
}

type readOut struct {
	Path       string `json:"path"`
	Size       int64  `json:"size"`
	Offset     int64  `json:"offset"`
	Length     int    `json:"length"`
	NextOffset int64  `json:"next_offset"`
	EOF        bool   `json:"eof"`
	Encoding   string `json:"encoding"`
	Content    string `json:"content"`
}

type listDirIn struct {
	SessionID string `json:"session_id" jsonschema:"the session's id, from create_session"`
	Path      string `json:"path,omitempty" jsonschema:"the directory, relative to the workspace (default: the workspace)"`
}

type dirEntry struct {
	Name string `json:"name"`
	Type string `json:"type"`
	Size int64  `json:"size,omitempty"`
}

type listDirOut struct {
	Path    string     `json:"path"`
	Entries []dirEntry `json:"entries"`
}

type listSessionsOut struct {
	Sessions []sessionOut `json:"sessions"`
}

type touchOut struct {
	SessionID string    `json:"session_id"`
	ExpiresAt time.Time `json:"expires_at"`
}

type destroyOut struct {
	SessionID string `json:"session_id"`
	Destroyed bool   `json:"destroyed"`
}

type startIn struct {
	SessionID string `json:"session_id" jsonschema:"the session's id, from create_session"`
	commandIn
	Cwd            string            `json:"cwd,omitempty" jsonschema:"working directory, relative to the workspace (default: the workspace); it must exist"`
	Env            map[string]string `json:"env,omitempty" jsonschema:"environment overlaid on the session's (values are secrets: never shown back)"`
	TimeoutSeconds float64           `json:"timeout_seconds,omitempty" jsonschema:"kill the process after this many seconds (default: 3600)"`
}

type startOut struct {
	ProcessID string `json:"process_id"`
	SessionID string `json:"session_id"`
}

type processIn struct {
	ProcessID string `json:"process_id" jsonschema:"the process's id, from start_process"`
}

type readProcIn struct {
	ProcessID   string  `json:"process_id" jsonschema:"the process's id, from start_process"`
	Cursor      int64   `json:"cursor,omitempty" jsonschema:"where to read from: 0 at first, then the next_cursor of the last read"`
	WaitSeconds float64 `json:"wait_seconds,omitempty" jsonschema:"when there is no new output yet, wait up to this many seconds (at most 60) for some or for the exit (default: 0, return at once)"`
	MaxBytes    int     `json:"max_bytes,omitempty" jsonschema:"the most output bytes to return (default and cap: the server's result limit)"`
}

type readProcOut struct {
	Stdout         string `json:"stdout"`
	Stderr         string `json:"stderr"`
	StdoutEncoding string `json:"stdout_encoding,omitempty"`
	StderrEncoding string `json:"stderr_encoding,omitempty"`
	NextCursor     int64  `json:"next_cursor"`
	DroppedBytes   int64  `json:"dropped_bytes,omitempty"`
	More           bool   `json:"more,omitempty"`
	Running        bool   `json:"running"`
	ExitCode       *int   `json:"exit_code,omitempty"`
	Error          string `json:"error,omitempty"`
}

type writeStdinIn struct {
	ProcessID string `json:"process_id" jsonschema:"the process's id, from start_process"`
	Data      string `json:"data" jsonschema:"the bytes to write to the process's stdin, delivered whole and in order"`
	Encoding  string `json:"encoding,omitempty" jsonschema:"text (the default) or base64"`
}

type bytesOut struct {
	Bytes int `json:"bytes"`
}

type okOut struct {
	OK bool `json:"ok"`
}

type killOut struct {
	ProcessID string `json:"process_id"`
	ExitCode  *int   `json:"exit_code,omitempty"`
	Error     string `json:"error,omitempty"`
}

type processInfo struct {
	ProcessID   string    `json:"process_id"`
	SessionID   string    `json:"session_id"`
	Argv        []string  `json:"argv"`
	StartedAt   time.Time `json:"started_at"`
	Running     bool      `json:"running"`
	ExitCode    *int      `json:"exit_code,omitempty"`
	OutputBytes int64     `json:"output_bytes"`
}

type listProcsOut struct {
	Processes []processInfo `json:"processes"`
}

// tool registers one tool: its input schema inferred from In, with the
// enums of enums set on it, its output schema from Out, and a handler that
// gets the connection.
//
// It registers a raw handler rather than going through mcp.AddTool, and
// does what that does here with encoding/json: the SDK's typed path
// decodes the arguments twice and re-reads its own output to validate it,
// each decode through a decoder that allocates a 32 KiB buffer, which made
// its garbage most of a tool call's cost (bench/mcp). The arguments are
// still validated against the schema before they are decoded.
func tool[In, Out any](s *Server, name, desc string, enums map[string][]string, h func(context.Context, *conn, In) (Out, error)) {
	in, err := jsonschema.For[In](nil)
	if err != nil {
		panic(fmt.Sprintf("mcpserver: the input schema of %s: %v", name, err))
	}
	for prop, values := range enums {
		p, ok := in.Properties[prop]
		if !ok {
			panic(fmt.Sprintf("mcpserver: %s has no property %s", name, prop))
		}
		for _, v := range values {
			p.Enum = append(p.Enum, v)
		}
	}
	resolved, err := in.Resolve(&jsonschema.ResolveOptions{ValidateDefaults: true})
	if err != nil {
		panic(fmt.Sprintf("mcpserver: the input schema of %s: %v", name, err))
	}
	out, err := jsonschema.For[Out](nil)
	if err != nil {
		panic(fmt.Sprintf("mcpserver: the output schema of %s: %v", name, err))
	}
	s.mcp.AddTool(&mcp.Tool{Name: name, Description: desc, InputSchema: in, OutputSchema: out},
		func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			args, err := decodeArgs[In](resolved, req.Params.Arguments)
			if err != nil {
				return errorResult(err), nil
			}
			c, err := s.connOf(req.Session)
			if err != nil {
				return errorResult(err), nil
			}
			v, err := h(ctx, c, args)
			if err != nil {
				return errorResult(toolError(err)), nil
			}
			b, err := json.Marshal(v)
			if err != nil {
				return nil, fmt.Errorf("marshaling the result of %s: %w", name, err)
			}
			// The text block carries the same JSON for clients that read
			// no structured content, as the specification suggests.
			return &mcp.CallToolResult{
				StructuredContent: json.RawMessage(b),
				Content:           []mcp.Content{&mcp.TextContent{Text: string(b)}},
			}, nil
		})
}

// decodeArgs validates a call's arguments against the tool's schema, then
// decodes them. Missing arguments are an empty object.
func decodeArgs[In any](schema *jsonschema.Resolved, raw json.RawMessage) (In, error) {
	var in In
	m := map[string]any{}
	if len(raw) > 0 {
		if err := json.Unmarshal(raw, &m); err != nil {
			return in, fmt.Errorf("unmarshaling arguments: %w", err)
		}
	}
	if m == nil { // the arguments were null
		m = map[string]any{}
	}
	if err := schema.Validate(m); err != nil {
		return in, fmt.Errorf("validating \"arguments\": %w", err)
	}
	if len(raw) > 0 {
		if err := json.Unmarshal(raw, &in); err != nil {
			return in, fmt.Errorf("unmarshaling arguments: %w", err)
		}
	}
	return in, nil
}

func errorResult(err error) *mcp.CallToolResult {
	var r mcp.CallToolResult
	r.SetError(err)
	return &r
}

// toolError is the text of a tool's failure: the sandbox's message, which
// names the cause and never holds a secret.
func toolError(err error) error {
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("the call was cancelled or ran out of time: %w", err)
	}
	return err
}

var (
	networks    = []string{string(sandbox.NetworkNone), string(sandbox.NetworkInternal), string(sandbox.NetworkEgress)}
	isolations  = []string{string(sandbox.IsolationNone), string(sandbox.IsolationContainer), string(sandbox.IsolationVM)}
	inEncodings = []string{encText, encBase64}
)

func (s *Server) addTools() {
	tool(s, "create_session", "Create a disposable session and return its session_id, with its isolation (none is no sandbox: commands run on the user's machine) and network. The operator's policy caps network, isolation and persistence: a request beyond it is refused with the reason. The session is destroyed when this connection ends (unless persistent) and expires after ttl_seconds unless touched.",
		map[string][]string{"network": networks, "isolation": isolations}, s.createSession)
	tool(s, "run", "Run a command in a session to completion and return its exit code, stdout and stderr. A non-zero exit is a result, not an error. Output past the result limit is cut: the result says so, with the full byte counts, and the whole output is in stdout_file/stderr_file in the workspace (page it with read_file). A command past timeout_seconds is killed and reported as an error with the byte counts of its output. For servers and long jobs use start_process.",
		map[string][]string{"stdin_encoding": inEncodings}, s.run)
	tool(s, "write_file", "Write a file in a session's workspace, replacing it whole; missing parent directories are made. Binary content goes base64 with encoding base64.",
		map[string][]string{"encoding": inEncodings}, s.writeFile)
	tool(s, "read_file", "Read a file from a session's workspace: up to length bytes from offset, as text when they are UTF-8, else base64 (encoding says which). size is the whole file's; page with next_offset until eof.",
		map[string][]string{"encoding": {encAuto, encText, encBase64}}, s.readFile)
	tool(s, "list_dir", "List a directory of a session: each entry's name, type (file, dir, symlink, other) and a file's size. Runs sh in the session.",
		nil, s.listDir)
	tool(s, "list_sessions", "List the sandbox's live sessions; this_connection marks those this connection created.",
		nil, s.listSessions)
	tool(s, "touch", "Keep a session alive: extend its expiry to now + its ttl_seconds.",
		nil, s.touch)
	tool(s, "destroy_session", "Destroy a session and everything running in it. A session that is already gone is not an error.",
		nil, s.destroySession)
	tool(s, "start_process", "Start a command in the background (a server, a long job) and return its process_id at once. Read its output with read_process_output, feed its stdin with write_process_stdin, end it with kill_process. It is killed after timeout_seconds (default 3600) and when this connection ends.",
		nil, s.startProcess)
	tool(s, "read_process_output", "Read a background process's stdout and stderr from cursor on (0 at first, then next_cursor), waiting up to wait_seconds for new output. running false and exit_code tell it has ended; dropped_bytes tells output that was discarded unread because the process wrote faster than it was read.",
		nil, s.readProcess)
	tool(s, "write_process_stdin", "Write to a background process's stdin, whole and in order.",
		map[string][]string{"encoding": inEncodings}, s.writeStdin)
	tool(s, "close_process_stdin", "Close a background process's stdin (end of input).",
		nil, s.closeStdin)
	tool(s, "kill_process", "Kill a background process, wait for its end and forget it; returns its exit code. Read its output first: it is gone afterwards.",
		nil, s.killProcess)
	tool(s, "list_processes", "List this connection's background processes: running or not, exit code, output so far.",
		nil, s.listProcesses)
}

// sessions caches the sessions the tools use, so that a call costs no
// lookup round trip to a daemon; a destroyed session's next call fails
// with its own not-found error, which evicts it.
type sessionCache struct {
	mu sync.Mutex
	m  map[string]sandbox.Session
}

func (s *Server) session(ctx context.Context, id string) (sandbox.Session, error) {
	s.cache.mu.Lock()
	sess, ok := s.cache.m[id]
	s.cache.mu.Unlock()
	if ok {
		return sess, nil
	}
	sess, err := s.sb.GetSession(ctx, id)
	if err != nil {
		return nil, err
	}
	s.remember(sess)
	return sess, nil
}

func (s *Server) remember(sess sandbox.Session) {
	s.cache.mu.Lock()
	defer s.cache.mu.Unlock()
	if s.cache.m == nil {
		s.cache.m = map[string]sandbox.Session{}
	}
	s.cache.m[sess.ID()] = sess
}

// evictOn drops the session from the cache when err says it is gone, and
// returns err.
func (s *Server) evictOn(id string, err error) error {
	if errors.Is(err, sandbox.ErrSessionNotFound) {
		s.evict(id)
	}
	return err
}

// evict forgets the session's cached handle.
func (s *Server) evict(id string) {
	s.cache.mu.Lock()
	delete(s.cache.m, id)
	s.cache.mu.Unlock()
}

func (s *Server) createSession(ctx context.Context, c *conn, in createIn) (createOut, error) {
	spec := sandbox.SessionSpec{
		Image:      or(in.Image, s.opts.DefaultImage),
		Durability: sandbox.Ephemeral,
		Network:    sandbox.Network(or(in.Network, string(sandbox.NetworkNone))),
		Isolation:  sandbox.Isolation(in.Isolation),
		CPU:        in.CPU,
		MemoryMB:   in.MemoryMB,
		TTLSeconds: in.TTLSeconds,
		Env:        sandbox.SecretEnv(in.Env),
		Labels:     map[string]string{},
	}
	if spec.TTLSeconds == 0 {
		spec.TTLSeconds = DefaultTTLSeconds
	}
	if in.Persistent != "" {
		spec.Durability, spec.WorkspaceKey = sandbox.Persistent, in.Persistent
	}
	for k, v := range in.Labels {
		if k == LabelConnection {
			return createOut{}, &sandbox.SpecRejectedError{Field: "labels", Reason: sandbox.ReasonUnenforceable,
				Message: fmt.Sprintf("the label %s is the server's own: it names the connection a session belongs to", LabelConnection)}
		}
		spec.Labels[k] = v
	}
	spec.Labels[LabelConnection] = c.id
	sess, err := s.sb.CreateSession(ctx, spec)
	if err != nil {
		return createOut{}, err
	}
	if spec.Durability == sandbox.Ephemeral {
		if err := c.own(sess.ID()); err != nil {
			_ = sess.Destroy(context.WithoutCancel(ctx))
			return createOut{}, err
		}
	}
	s.remember(sess)
	info, err := sess.Info(ctx)
	if err != nil {
		return createOut{}, s.evictOn(sess.ID(), err)
	}
	return createOut{sessionOut: sessionOutOf(info, c.id), Isolation: s.isolationOf(spec), Network: string(spec.Network)}, nil
}

// isolationOf is the isolation of a session created with spec: a sandbox
// runs every session at its own isolation, which a spec's may not exceed
// (a weaker one asked for is raised to it), so the stronger of the two.
func (s *Server) isolationOf(spec sandbox.SessionSpec) string {
	iso := s.opts.Isolation
	if spec.Isolation != "" && sandbox.IsolationStrength(spec.Isolation) > sandbox.IsolationStrength(iso) {
		iso = spec.Isolation
	}
	if iso == "" {
		return "unknown"
	}
	return string(iso)
}

func (s *Server) timeout(seconds float64, def time.Duration) (time.Duration, error) {
	if seconds == 0 {
		return def, nil
	}
	if seconds < 0 || math.IsNaN(seconds) || math.IsInf(seconds, 0) || seconds > 366*24*3600 {
		return 0, fmt.Errorf("timeout_seconds %v: give a number of seconds > 0", seconds)
	}
	return time.Duration(seconds * float64(time.Second)), nil
}

func (s *Server) run(ctx context.Context, _ *conn, in runIn) (runOut, error) {
	argv, err := in.argv()
	if err != nil {
		return runOut{}, err
	}
	timeout, err := s.timeout(in.TimeoutSeconds, s.sb.ExecDefaultTimeout())
	if err != nil {
		return runOut{}, err
	}
	stdin, err := decode("stdin", in.Stdin, in.StdinEncoding)
	if err != nil {
		return runOut{}, err
	}
	sess, err := s.session(ctx, in.SessionID)
	if err != nil {
		return runOut{}, err
	}
	res, err := sess.Exec(ctx, argv, sandbox.ExecOptions{Cwd: in.Cwd, Env: sandbox.SecretEnv(in.Env), Stdin: stdin, Timeout: timeout})
	if err != nil {
		var te *sandbox.ExecTimeoutError
		if errors.As(err, &te) {
			return runOut{}, fmt.Errorf("the command timed out after %v and was killed; it had written %d bytes to stdout and %d to stderr (a timed-out command's output is not returned: run it with start_process to read its output as it comes)%s",
				te.Timeout, te.StdoutLen, te.StderrLen, noteOf(te.Note))
		}
		return runOut{}, s.evictOn(in.SessionID, err)
	}
	return s.bound(ctx, sess, res)
}

func noteOf(note string) string {
	if note == "" {
		return ""
	}
	return "; " + note
}

// bound fits a result's output into the result limit. Past it, each
// stream keeps its head, and the whole of a cut stream is written to a
// file in the workspace the result names.
func (s *Server) bound(ctx context.Context, sess sandbox.Session, res sandbox.ExecResult) (runOut, error) {
	out := runOut{ExitCode: res.ExitCode, StdoutBytes: len(res.Stdout), StderrBytes: len(res.Stderr)}
	limit := s.opts.MaxResultBytes
	outCap := max(limit/2, limit-len(res.Stderr))
	errCap := limit - min(len(res.Stdout), outCap)
	stdout, stderr := res.Stdout, res.Stderr
	if len(stdout) > outCap || len(stderr) > errCap {
		out.Truncated = true
		base := fmt.Sprintf(".tai42-mcp/%s", newID(time.Now().UTC().Format("20060102T150405")))
		var cut []string
		if len(stdout) > outCap {
			out.StdoutFile = base + ".stdout"
			if err := sess.PutFile(ctx, out.StdoutFile, []byte(stdout)); err != nil {
				return runOut{}, fmt.Errorf("the command exited %d, but its stdout (%d bytes, past the result limit) could not be saved to %s: %w", res.ExitCode, len(stdout), out.StdoutFile, err)
			}
			stdout = stdout[:cutUTF8([]byte(stdout), outCap)]
			cut = append(cut, fmt.Sprintf("stdout shows %d of %d bytes, all in %s", len(stdout), len(res.Stdout), out.StdoutFile))
		}
		if len(stderr) > errCap {
			out.StderrFile = base + ".stderr"
			if err := sess.PutFile(ctx, out.StderrFile, []byte(stderr)); err != nil {
				return runOut{}, fmt.Errorf("the command exited %d, but its stderr (%d bytes, past the result limit) could not be saved to %s: %w", res.ExitCode, len(stderr), out.StderrFile, err)
			}
			stderr = stderr[:cutUTF8([]byte(stderr), errCap)]
			cut = append(cut, fmt.Sprintf("stderr shows %d of %d bytes, all in %s", len(stderr), len(res.Stderr), out.StderrFile))
		}
		out.Note = "output past the result limit of " + fmt.Sprint(limit) + " bytes: " + strings.Join(cut, "; ") + " (read_file pages it)"
	}
	out.Stdout, out.StdoutEncoding = encode([]byte(stdout))
	out.Stderr, out.StderrEncoding = encode([]byte(stderr))
	return out, nil
}

// encode returns b as text when it is UTF-8, else as base64 with the
// encoding's name ("" for text, which is the default).
func encode(b []byte) (string, string) {
	if utf8.Valid(b) {
		return string(b), ""
	}
	return base64.StdEncoding.EncodeToString(b), encBase64
}

func decode(field, s, enc string) ([]byte, error) {
	switch enc {
	case "", encText:
		return []byte(s), nil
	case encBase64:
		b, err := base64.StdEncoding.DecodeString(s)
		if err != nil {
			return nil, fmt.Errorf("%s is not valid base64: %v", field, err)
		}
		return b, nil
	}
	return nil, fmt.Errorf("%s's encoding %q: give text or base64", field, clip(enc))
}

func (s *Server) writeFile(ctx context.Context, _ *conn, in writeIn) (writeOut, error) {
	data, err := decode("content", in.Content, in.Encoding)
	if err != nil {
		return writeOut{}, err
	}
	sess, err := s.session(ctx, in.SessionID)
	if err != nil {
		return writeOut{}, err
	}
	if err := sess.PutFile(ctx, in.Path, data); err != nil {
		return writeOut{}, s.evictOn(in.SessionID, err)
	}
	return writeOut{Path: in.Path, Bytes: len(data)}, nil
}

func (s *Server) readFile(ctx context.Context, _ *conn, in readIn) (readOut, error) {
	if in.Offset < 0 || in.Length < 0 {
		return readOut{}, fmt.Errorf("offset and length must not be negative (offset %d, length %d)", in.Offset, in.Length)
	}
	switch in.Encoding {
	case "", encAuto, encText, encBase64:
	default:
		return readOut{}, fmt.Errorf("encoding %q: give auto, text or base64", clip(in.Encoding))
	}
	length := s.opts.MaxResultBytes
	if in.Length > 0 {
		length = min(in.Length, length)
	}
	sess, err := s.session(ctx, in.SessionID)
	if err != nil {
		return readOut{}, err
	}
	data, size, err := readRange(ctx, sess, in.Path, in.Offset, length)
	if err != nil {
		return readOut{}, s.evictOn(in.SessionID, err)
	}
	out := readOut{Path: in.Path, Size: size, Offset: in.Offset, Length: len(data), NextOffset: in.Offset + int64(len(data))}
	out.EOF = out.NextOffset >= size
	switch in.Encoding {
	case encText:
		if !utf8.Valid(data) {
			return readOut{}, fmt.Errorf("%s bytes %d to %d are not UTF-8 text: read them with encoding base64 (or auto)", in.Path, in.Offset, out.NextOffset)
		}
		out.Content, out.Encoding = string(data), encText
	case encBase64:
		out.Content, out.Encoding = base64.StdEncoding.EncodeToString(data), encBase64
	default:
		out.Content, out.Encoding = encode(data)
		if out.Encoding == "" {
			out.Encoding = encText
		}
	}
	return out, nil
}

func (s *Server) listSessions(ctx context.Context, c *conn, _ struct{}) (listSessionsOut, error) {
	infos, err := s.sb.ListSessions(ctx)
	if err != nil {
		return listSessionsOut{}, err
	}
	out := listSessionsOut{Sessions: []sessionOut{}}
	for _, info := range infos {
		out.Sessions = append(out.Sessions, sessionOutOf(info, c.id))
	}
	return out, nil
}

func (s *Server) touch(ctx context.Context, _ *conn, in sessionIn) (touchOut, error) {
	sess, err := s.session(ctx, in.SessionID)
	if err != nil {
		return touchOut{}, err
	}
	if err := sess.Touch(ctx); err != nil {
		return touchOut{}, s.evictOn(in.SessionID, err)
	}
	info, err := sess.Info(ctx)
	if err != nil {
		return touchOut{}, s.evictOn(in.SessionID, err)
	}
	return touchOut{SessionID: info.ID, ExpiresAt: info.ExpiresAt}, nil
}

func (s *Server) destroySession(ctx context.Context, c *conn, in sessionIn) (destroyOut, error) {
	if in.SessionID == "" {
		return destroyOut{}, errors.New("session_id is empty")
	}
	if err := s.sb.DestroySession(ctx, in.SessionID); err != nil {
		return destroyOut{}, err
	}
	s.evict(in.SessionID)
	c.dropSession(in.SessionID)
	return destroyOut{SessionID: in.SessionID, Destroyed: true}, nil
}

func (s *Server) startProcess(ctx context.Context, c *conn, in startIn) (startOut, error) {
	argv, err := in.argv()
	if err != nil {
		return startOut{}, err
	}
	timeout, err := s.timeout(in.TimeoutSeconds, DefaultProcessTimeout)
	if err != nil {
		return startOut{}, err
	}
	sess, err := s.session(ctx, in.SessionID)
	if err != nil {
		return startOut{}, err
	}
	h, err := sess.ExecStart(ctx, argv, sandbox.StartOptions{Cwd: in.Cwd, Env: sandbox.SecretEnv(in.Env), Timeout: timeout})
	if err != nil {
		return startOut{}, s.evictOn(in.SessionID, err)
	}
	p := startProcess(newID("p"), in.SessionID, slices.Clone(argv), h, s.opts.MaxProcessBytes)
	if err := c.addProcess(p); err != nil {
		_ = p.kill(context.WithoutCancel(ctx))
		return startOut{}, err
	}
	return startOut{ProcessID: p.id, SessionID: in.SessionID}, nil
}

func (s *Server) readProcess(ctx context.Context, c *conn, in readProcIn) (readProcOut, error) {
	p, err := c.process(in.ProcessID)
	if err != nil {
		return readProcOut{}, err
	}
	if in.WaitSeconds < 0 || in.WaitSeconds > maxWaitSeconds || math.IsNaN(in.WaitSeconds) {
		return readProcOut{}, fmt.Errorf("wait_seconds %v: give 0 to %d", in.WaitSeconds, maxWaitSeconds)
	}
	if in.MaxBytes < 0 {
		return readProcOut{}, fmt.Errorf("max_bytes %d is negative", in.MaxBytes)
	}
	limit := s.opts.MaxResultBytes
	if in.MaxBytes > 0 {
		limit = min(limit, in.MaxBytes)
	}
	o, err := p.read(ctx, in.Cursor, time.Duration(in.WaitSeconds*float64(time.Second)), limit)
	if err != nil {
		return readProcOut{}, err
	}
	out := readProcOut{NextCursor: o.next, DroppedBytes: o.dropped, More: o.more, Running: !o.finished}
	out.Stdout, out.StdoutEncoding = encode(o.stdout)
	out.Stderr, out.StderrEncoding = encode(o.stderr)
	if o.finished {
		exitOrError(o.exitCode, o.err, &out.ExitCode, &out.Error)
	}
	return out, nil
}

// exitOrError sets the exit code of an ended exec, or the error its stream
// ended with.
func exitOrError(code int, err error, exit **int, msg *string) {
	if err != nil {
		*msg = err.Error()
		return
	}
	*exit = &code
}

func (s *Server) writeStdin(ctx context.Context, c *conn, in writeStdinIn) (bytesOut, error) {
	p, err := c.process(in.ProcessID)
	if err != nil {
		return bytesOut{}, err
	}
	data, err := decode("data", in.Data, in.Encoding)
	if err != nil {
		return bytesOut{}, err
	}
	if err := p.h.WriteStdin(ctx, data); err != nil {
		return bytesOut{}, err
	}
	return bytesOut{Bytes: len(data)}, nil
}

func (s *Server) closeStdin(ctx context.Context, c *conn, in processIn) (okOut, error) {
	p, err := c.process(in.ProcessID)
	if err != nil {
		return okOut{}, err
	}
	if err := p.h.CloseStdin(ctx); err != nil {
		return okOut{}, err
	}
	return okOut{OK: true}, nil
}

func (s *Server) killProcess(ctx context.Context, c *conn, in processIn) (killOut, error) {
	p, err := c.process(in.ProcessID)
	if err != nil {
		return killOut{}, err
	}
	if err := p.kill(ctx); err != nil {
		return killOut{}, err
	}
	c.forget(p.id)
	out := killOut{ProcessID: p.id}
	p.mu.Lock()
	exitOrError(p.exitCode, p.err, &out.ExitCode, &out.Error)
	p.mu.Unlock()
	return out, nil
}

func (s *Server) listProcesses(_ context.Context, c *conn, _ struct{}) (listProcsOut, error) {
	out := listProcsOut{Processes: []processInfo{}}
	for _, p := range c.processes() {
		p.mu.Lock()
		info := processInfo{ProcessID: p.id, SessionID: p.sessionID, Argv: p.argv, StartedAt: p.started, Running: !p.finished, OutputBytes: p.end}
		if p.finished && p.err == nil {
			code := p.exitCode
			info.ExitCode = &code
		}
		p.mu.Unlock()
		out.Processes = append(out.Processes, info)
	}
	return out, nil
}

func or(v, def string) string {
	if v == "" {
		return def
	}
	return v
}

// clip shortens a caller's string quoted in an error.
func clip(s string) string {
	const n = 64
	if len(s) <= n {
		return s
	}
	return s[:cutUTF8([]byte(s), n)] + "…"
}
