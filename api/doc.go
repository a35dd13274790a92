// Package api holds the wire format of the TAI42 Sandbox HTTP API, shared by
// the server (package server) and the Go client (package client): the route
// table, the JSON bodies, the error mapping and the frames of the interactive
// exec stream. It imports only the standard library and the contract.
//
// # Conventions
//
// Every route under /v1 requires "Authorization: Bearer TOKEN". JSON bodies
// use the contract's snake_case field names; unknown fields are refused.
// Errors are a JSON body {"error": {"kind": ..., "message": ..., fields...}}
// with the status of [KindStatus]; [ErrorBody] and [Error.Err] convert both
// ways, once each.
//
// # Interactive exec (WebSocket)
//
// GET /v1/sessions/{id}/exec/stream upgrades to a WebSocket with
// subprotocol [ExecSubprotocol]. Frames:
//
//	client → server
//	  text   {"type":"start","argv":[...],"cwd":"","env":{},"timeout_seconds":N}   first, exactly once
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
// A start that fails (unknown session, bad argv) gets an "error" frame and the
// close. After the last frame the server closes with status 1000. A client
// that closes the connection or vanishes kills its exec. Stdin frames and
// close_stdin are applied in the order sent; kill is applied at once, even
// while a stdin write waits on a full pipe. An "error" frame of kind
// exec_timeout carries exit_code when the server killed the exec at its
// deadline and read its status: a client whose kill returned before it
// delivered the timeout reports that exit instead, as the contract requires.
package api
