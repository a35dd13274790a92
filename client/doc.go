// Package client is the Go client of the TAI42 Sandbox HTTP API: a
// [sandbox.Sandbox] whose sessions and exec handles live in a daemon
// (tai42 serve) reached over HTTP, HTTPS or a unix socket.
//
//	c := client.New("http://127.0.0.1:4242", token)
//	defer c.Close()
//	sess, err := c.CreateSession(ctx, spec)
//
// Every method of the contract keeps its contract over the wire, and the
// client passes the conformance suite (package sandboxtest) against the
// daemon. Sessions also implement [sandbox.FileStreamer], so files move
// without being held whole in memory, and the client implements
// [sandbox.WorkspaceManager]: it lists and removes the daemon's persistent
// workspaces.
//
// # Errors
//
// Every error a method returns belongs to the sandbox family
// (errors.Is(err, sandbox.ErrSandbox)). An error the daemon answers is
// rebuilt with [api.Error.Err] into the contract's own type with every field
// (a *sandbox.SessionNotFoundError with its SessionID, a
// *sandbox.ExecTimeoutError with its lengths and timeout, ...); an answer
// that is not an API error body is a *sandbox.SandboxError naming the HTTP
// status. A daemon that cannot be reached gives a *sandbox.SandboxError
// saying so, whose cause is the network error; a connection closed before
// the answer was whole (a call's, an exec stream's, a download's) one whose
// cause is [ErrConnectionClosed], never io.EOF. A call whose context ends
// returns a *sandbox.SandboxError that also matches ctx.Err() with
// errors.Is. The bearer token and env values never appear in an error.
//
// # Interactive execs
//
// [sandbox.Session.ExecStart] opens one WebSocket per exec (subprotocol
// [api.ExecSubprotocol]). A reader goroutine per handle takes the daemon's
// frames in: output chunks and the stream's last frame go to an output
// queue bounded at [StreamBuffer] bytes (when it is full the reader stops
// reading, which back-pressures the daemon and the exec); acknowledgements
// of stdin writes, close_stdin and kill complete their requests at once.
// An acknowledgement comes behind the output sent before it, so the bound
// moves while one is awaited. Once a kill is on its way, or the session is
// gone, it is lifted: the exec is ending and its remaining output is
// finite, so the kill's acknowledgement behind it is always read, and Kill
// returns promptly even when nobody calls Next. While a stdin write or
// close_stdin waits for its acknowledgement it is raised to 8×StreamBuffer,
// room for all the output the daemon can have sent ahead of it: WriteStdin
// to an exec that has exited fails promptly with nobody calling Next, and
// an exec that does not read its stdin while its output flows still cannot
// fill the client's memory. A session destroyed through this client lifts
// the bound of its handles at once; a reader that waits at the bound for
// 2 s asks the daemon every 2 s whether its session still exists, so that a
// session destroyed elsewhere (another client, the reaper) frees the handle
// too (a session the daemon says is gone but has not reaped yet, an expired
// one, is then destroyed, so that its exec ends). The reader goroutine ends and the connection closes as soon as the
// stream's last frame has arrived (or the connection is lost); the queue
// stays readable by Next.
//
// Frame ids of stdin, close_stdin and kill start at 1, and at most one
// stdin frame (of at most [api.MaxStdinFrame] bytes) is ever
// unacknowledged: each is sent once the one before was acknowledged, even
// after a WriteStdin was cancelled while its frame waited.
package client
