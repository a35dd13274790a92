// Package agent is the in-sandbox agent and its client.
//
// The agent ("tai42 agent") runs as PID 1 of every sandbox whose provider is
// not the host runner. It reaps every zombie, starts execs, streams their
// stdin, stdout and stderr with back-pressure, kills their process groups,
// and reads and writes files traversal-safely. The provider on the host
// talks to it through a [Client]; the agent serves with [Serve] (or
// [ServeFD], which the hidden "tai42 agent" command calls).
//
// # Protocol, versions 1 and 2 (normative)
//
// The protocol runs over reliable, ordered byte streams ("connections"): a
// unix socket for containers, a TCP connection through a Kubernetes
// port-forward, or a stream of a multiplexed connection (op "mux" below).
// The client opens a connection of its own for each operation, so
// every operation gets the transport's flow control for itself. Nothing is
// shared between connections except an interactive exec's id.
//
// Frames. Everything on a connection is a frame:
//
//	type    1 byte
//	length  4 bytes, big-endian: the payload's length
//	payload length bytes
//
// A payload is at most 4 MiB (an exec request must carry argv and the
// environment, which the kernel allows up to ARG_MAX, 2 MiB by default,
// and JSON can nearly double); a data, stdout or stderr payload is at most
// 256 KiB. A receiver treats a larger length as a protocol error and drops
// the connection. Control payloads are JSON objects (unknown keys are
// ignored); data payloads are raw bytes.
//
// Frame types:
//
//	'Q' request     client→agent  JSON: the first frame of every connection
//	'R' reply       agent→client  JSON: the operation's answer
//	'E' error       agent→client  JSON: the operation failed; the last frame
//	'D' data        both ways     raw: exec stdin, file content
//	'N' end         both ways     empty: the data is complete
//	'B' abort       client→agent  empty: drop the upload
//	'1' stdout      agent→client  raw: a piece of the exec's stdout
//	'2' stderr      agent→client  raw: a piece of the exec's stderr
//	'A' ack         agent→client  JSON: a stdin data frame was handled
//	'X' cancel      client→agent  empty: stop the stdin write in progress
//	'C' close_stdin client→agent  empty: close the exec's stdin
//	'K' kill        client→agent  JSON: kill the exec's process group
//	'x' exited      agent→client  empty: the command was reaped
//	'Z' exit        agent→client  JSON: the exec's end
//
// Request. The first frame of a connection is a request:
//
//	{"v": 1, "op": "ping"|"exec"|"attach"|"put"|"get"|"mux", ...}
//
// "v" is the protocol version the request is written in. Version 2 is
// version 1 with an exec's "user"; a client writes an exec with a user in
// version 2 and every other request in version 1, so that it keeps working
// with an agent that speaks version 1 alone (a session started by an older
// tai42), which refuses only the exec with a user. An agent speaks
// versions 1 and 2; to a request of another version it answers an error
// frame of kind "version" whose message names the versions, and closes the
// connection. A request of version 1 that sets "user" is a protocol error. JSON strings cannot carry bytes that
// are not UTF-8 (an encoder replaces them), so when any string of a request
// is not valid UTF-8 the client sets "b64": true and sends every string of
// the request (argv, env, dir, dir_orig, root, rel, orig, user) as the standard
// base64 of its bytes.
//
// Error frame:
//
//	{"kind": "sandbox"|"not_found"|"user_not_found"|"version"|"protocol",
//	 "op": "put_file", "message": "...", "cause": "...", "path": "...", "user": "..."}
//
// "not_found" (get) means nothing exists at the path; "path" is the
// caller's original path. "user_not_found" (exec, version 2) means the
// exec's user is a name with no entry in the agent's /etc/passwd; "user"
// is that name. "sandbox" is any other failure the caller should
// see: "op" (may be empty: the client then uses its own) and "message" say
// what failed, "cause" is the underlying error's text. "protocol" means the
// peer broke the protocol. After an error frame the agent closes the
// connection.
//
// ping: the reply is {"v": n}, n the request's version: the agent is
// ready and speaks it. A client pings in version 1.
//
// mux (version 1): the reply is {"v": 1}; after it the connection carries
// a yamux session (github.com/hashicorp/yamux's spec), the client its
// client end, and every stream the client opens on it is a connection of
// this protocol. The session ends with the connection; every stream on it
// then fails. An agent that predates the op answers an error of kind
// "protocol" ("unknown operation"), and the client opens a connection per
// operation instead.
//
// exec: the request carries
//
//	"argv": [...]        non-empty; argv[0] is looked up in the env's PATH
//	"env": ["K=V", ...]  the command's complete environment (secrets)
//	"dir": "/abs"        the working directory in the agent's filesystem
//	"dir_orig": "..."    the caller's cwd as given, for messages
//	"root", "rel"        optional: dir must stay inside root (the workspace);
//	                     rel is dir relative to it, checked through os.Root
//	"grace_ns": n        how long output may go on after the command's exit
//	"stdin_len": n       non-interactive: n > 0 bytes of stdin follow
//	"interactive": true  stdin is a pipe fed by data frames; output goes on
//	                     a second connection (attach)
//	"user": "..."        version 2, optional: the user the command runs as
//	                     (sandbox.ValidUser's forms: a name, a uid, uid:gid)
//
// A non-interactive exec with "stdin_len" n > 0 is followed by data frames
// carrying exactly n bytes; the agent reads them all before it starts the
// command, and writes them to the command's stdin pipe, which it then
// closes. Without stdin the command reads /dev/null.
//
// With a user, the agent resolves it in its own /etc/passwd and /etc/group
// (the session's: it is PID 1 of the session's root) as sandbox.ValidUser
// documents, and answers an error frame of kind user_not_found for a name
// with no passwd entry, or of kind sandbox for a user whose uid, gid or a
// supplementary group its user namespace does not map (the message names
// the id and the mapped ranges) or whose files cannot be read. The command
// then runs with those ids (setgroups, setgid, setuid in the child), and
// env gets HOME=<the user's home> when it has no HOME. The child enters
// dir before it takes the user's ids, as runc does, so it starts in a dir
// the user may not enter.
//
// The agent checks the cwd (an error frame "cwd %q does not exist in the
// workspace", "cwd %q is not a directory", or "cwd %q: it leads out of the
// workspace" for a symlink or ".." out of root, named by dir_orig), looks the
// command up, and starts it in a new process group. The reply is either
//
//	{"id": n}                                      started: exec id n
//	{"failed": true, "exit_code": 127, "message": base64}
//
// A command that cannot be found (127) or executed (126) is a result, not
// an error: "message" is the text for its stderr and no more frames follow.
//
// After {"id": n} on a non-interactive exec the agent sends stdout and
// stderr frames as it reads the pipes, the exited frame as soon as the
// command is reaped (in order with the output already sent; left out when
// the output is already over, the exit frame then following at once), and
// finally the exit frame, which implies exited:
//
//	{"code": 0, "known": true, "killed": false, "held": false}
//
// "code" is the exit status, or 128+signal for a command killed by a signal
// (-1 when "known" is false: the status could not be read). "killed" says a
// kill frame reached the agent before the command was reaped (a client
// tells a timeout from an exit that raced it by it). "held" says that after
// the command exited a process it left running still held the output pipes
// for the whole grace, so the output was cut there.
//
// Interactive exec: after {"id": n} the client opens a second connection
// and sends {"v": 1, "op": "attach", "id": n} (in version 1 whatever the
// exec's); the agent answers {} and
// then the stdout and stderr frames of the exec, and an end frame once both
// pipes are done (end-of-file, a kill, or the grace). The agent does not
// read the pipes before the attach, so no output is lost; an exec not
// attached within 30 seconds is killed. Only one attach is accepted. On the
// first connection the agent sends the ack frames, the exited frame and
// the exit frame, which comes once the output has ended too.
//
// Stdin (interactive). The client sends a data frame and waits for its ack
// before it sends the next: at most one write is outstanding. The agent
// writes the frame whole into the stdin pipe from a goroutine of its own,
// so a write blocked on a full pipe never stops it reading the connection
// (a kill acts at once). The ack is
//
//	{"n": bytes written, "err": ""|"cancelled"|"exited"|"closed"|"io", "msg": "..."}
//
// "exited": the command exited or closed its stdin (EPIPE); "closed":
// stdin was closed before (close_stdin or a cancelled write); "io": another
// failure, "msg" says which. A cancel frame stops the write in progress:
// its ack says "cancelled" with the bytes that went in, and if any did the
// agent closes stdin (no torn message may be followed by another). A
// cancel with no write in progress is ignored (its write's ack is on its
// way). A close_stdin frame closes stdin (idempotent).
//
// Kill: {"drain": false} (or an empty payload) kills the process group
// (SIGKILL) and stops reading the output at once; {"drain": true} kills it
// and goes on reading what the group wrote until end-of-file or the grace,
// so a timeout's lengths count every byte. A kill after the command exited ends the
// processes it left in its group; the agent keeps reading the first
// connection after the exit frame for that reason, until the client closes
// it. Closing the first connection before the exec ended (the command
// reaped and its output over; the exit frame is then on its way) kills the
// group (stop); closing it after leaves the group's processes running.
//
// Grace: after the command was reaped (exited or killed), each read of its
// output waits at most grace for data; a read that waits longer ends that
// stream and the exit frame says "held": true.
//
// put: the request carries "root" ("/workspace" for a path in the
// workspace, "/" for an absolute path outside it), "rel" (the clean path
// relative to root) and "orig" (the caller's path, for messages). The agent
// creates missing parent directories and a temporary file beside the
// target, then replies {} (or an error frame). The client sends data frames
// and an end frame; on end the agent moves the temporary file over the
// target and replies {} or an error frame. On abort, on a failure, or if
// the connection ends first, it removes the temporary file: the old file
// stays. A failure while writing is sent as an error frame at once, and
// the agent closes the connection. With "sync": true (a persistent
// workspace), the agent flushes the new content to disk before the move
// and the directory after it (and every directory it created on the way),
// so the end's reply means the file survives a crash of the machine.
//
// get: the request carries root, rel and orig as for put. The reply is
// {"size": n} (the size at open), then data frames, then an end frame; a
// read failure midway is an error frame instead of the end.
//
// Paths: for any root but "/" the agent opens it as an os.Root, so ".."
// and symlinks cannot lead out of it (an escape is refused with an error
// naming the path); root "/" is the agent's whole filesystem, where nothing
// is outside, and paths resolve as usual.
package agent
