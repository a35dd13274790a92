// Package api holds the wire format of the TAI42 Sandbox HTTP API, shared by
// the server (package server) and the Go client (package client): the route
// table, the JSON bodies, the error mapping and the frames of the interactive
// exec stream. It imports only the standard library and the contract.
//
// # Conventions
//
// Every route under /v1 requires "Authorization: Bearer TOKEN". JSON bodies
// are one JSON object with the contract's snake_case field names, matched
// exactly (case-sensitive); unknown fields and duplicate keys are refused.
// JSON bodies are capped at min(max_body_bytes, 64 MiB), file bodies at
// max_body_bytes; a declared Content-Length over the cap gets 413 before the
// body is read. A request body or a download that moves no byte for 60 s is
// cut. A response to a request whose body was not read (a refusal) closes
// the connection. timeout_seconds must be in (0, 9223372036]. A chunked
// file upload may declare the trailer TrailerUploadFailed and set it when
// its source fails midway: the put then fails (400) with the old content in
// place before the server answers.
// Errors are a JSON body {"error": {"kind": ..., "message": ..., fields...}}
// with the status of [KindStatus]; [ErrorBody] and [Error.Err] convert both
// ways, once each.
//
// # Exec as a user
//
// An [ExecRequest] (the body of POST /v1/sessions/{id}/exec and the start
// frame alike) may name the user its command runs as in "user", in the
// forms sandbox.ValidUser describes (a name, a uid, uid:gid), resolved in
// the session's own /etc/passwd and /etc/group; absent or "" is the
// session's default user. A name the session does not know is 400
// [KindUserNotFound] carrying user (an "error" frame on the stream); a
// malformed user, or one the provider cannot run an exec as, is 400
// sandbox_error. Nothing runs in either case.
//
// # Persistent workspaces
//
// GET /v1/workspaces answers a [WorkspaceList]: every persistent workspace,
// sorted by key, with the id of the live session holding it (in_use_by).
// DELETE /v1/workspaces/{key} removes one and its files (204). A key a live
// session holds, or one whose create or removal is under way, is refused
// with 422 spec_rejected (field workspace_key, reason conflict, op
// remove_workspace) naming the session; a key with no workspace is 404
// [KindWorkspaceNotFound] carrying workspace_key; a key that is not a valid
// workspace_key is 400 sandbox_error. A daemon whose sandbox does not
// implement sandbox.WorkspaceManager answers both routes with 400
// sandbox_error saying so.
//
// # Images
//
// POST /v1/images/pull takes a [PullRequest] ({"ref": "python:3.12-slim",
// "platform": "linux/arm64"}, platform optional) and answers 200 with
// [ContentTypeNDJSON]: one sandbox.PullProgress object per line, in the
// order of the pull's events (a "fetching" event the client has not taken
// yet is replaced by the next of its layer: a slow client holds up no
// pull), then one last line, a [PullEnd]:
// {"image": ImageInfo} or {"error": Error}. The answer starts with the
// first event: a pull that fails before any (an invalid reference, kind
// [KindImagePull] with reason invalid_reference) is a plain error response
// with its kind's status, as is a malformed body. A client that goes away
// cancels the pull. GET /v1/images answers an [ImageList], sorted by name;
// DELETE /v1/images/{name...} removes one (204; the name is the rest of
// the path, its '/' included, each segment percent-escaped on its own), a
// name not held being 404 [KindImageNotFound] carrying image; POST
// /v1/images/prune answers a sandbox.PruneResult. A daemon whose sandbox
// does not implement sandbox.ImageManager, or whose provider keeps no
// images, answers pull, remove and prune with 400 sandbox_error saying so
// (a kit sandbox lists no images then).
//
// # Interactive exec (WebSocket)
//
// GET /v1/sessions/{id}/exec/stream upgrades to a WebSocket with
// subprotocol [ExecSubprotocol]. Frames:
//
//	client → server
//	  text   {"type":"start","argv":[...],"cwd":"","env":{},"timeout_seconds":N,"user":""}   first, exactly once
//	  binary 0x00, id (8 bytes, big-endian), data                                  stdin bytes; acked by id
//	  text   {"type":"close_stdin","id":N}                                          acked by id
//	  text   {"type":"kill","id":N}                                                 acked by id once the exec is killed
//	server → client
//	  text   {"type":"started"}                                                     the exec runs
//	  binary 0x01, data                                                             stdout
//	  binary 0x02, data                                                             stderr
//	  text   {"type":"ack","id":N}  or  {"type":"ack","id":N,"error":{...}}
//	  text   {"type":"exit","exit_code":N}                                          last: the exec's exit
//	  text   {"type":"error","error":{...},"exit_code":N}                           last: the stream ended with an error
//
// Before the upgrade, a request that is not a WebSocket handshake for the
// subprotocol, or for an unknown session, gets a JSON error (400, 404). A
// start that fails after it (bad argv, a rejected timeout) gets an "error"
// frame and the close. The start frame must come within 30 s. After the
// last frame the server closes with status 1000. A protocol violation (a
// binary frame not tagged 0x00, an unknown type, a second start, bad JSON,
// an unknown field, a frame id of 0, too much stdin unacked) gets an
// "error" frame of kind bad_request, its exec is killed and the close is
// 1008; a frame over MaxClientFrame gets the same error frame and close
// 1009. Daemon shutdown ends a running exec with an "error" frame of kind
// shutting_down (with exit_code) and close 1001; an internal failure closes
// with 1011.
//
// Ids of stdin, close_stdin and kill frames are the client's, from 1 up.
// Stdin frames and close_stdin are applied in the order sent; the ack of
// one already applied comes before the last frame, and no ack follows the
// last frame (a client resolves what it still waits for when the stream
// ends). A client may have at most 2 MiB of stdin data and 1024 stdin and
// close_stdin frames sent and not yet acked: the server never stops
// reading, so a kill is applied as soon as it arrives, even while a stdin
// write waits on a full pipe. A client that waits for each stdin ack
// before its next stdin frame (as the Go client does) never meets the
// limit. One kill is in flight at a time: kill frames that come meanwhile
// are acked once it returned, and a client may have at most 1024 kill
// frames sent and not yet acked (the Go client has one).
//
// Deadline: the server enforces timeout_seconds itself. An "error" frame of
// kind exec_timeout carries exit_code when the server killed the exec at
// its deadline and read its status: a client whose kill returned before it
// delivered the timeout reports that exit instead, as the contract
// requires. An exec whose command exited before the deadline ends with its
// own exit even when its output is read after the deadline, where the
// provider's handles implement sandbox.ExitWatcher (the host's do).
//
// Liveness: a client that closes the connection, or whose connection
// drops, has its exec killed. The server pings every 15 s; a client that
// answers no ping within 15 s while the server has sent it nothing since
// its last pong is taken for gone. A client that stops reading while
// output it has not read is on its way (back-pressure) is not: before its
// exec ends, the exec's deadline bounds the wait; after, the server keeps
// the stream 10 minutes for it to read the rest.
package api
