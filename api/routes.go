package api

import "strings"

// Route is one endpoint of the API. Path uses net/http's ServeMux syntax,
// which is also the OpenAPI path syntax but for a trailing "{name...}"
// wildcard (a parameter that may hold '/'), which [Route.DocPath] writes as
// OpenAPI's "{name}".
type Route struct {
	Method      string
	Path        string
	OperationID string
	// Public routes need no bearer token.
	Public bool
}

// Pattern returns the ServeMux pattern "METHOD PATH".
func (r Route) Pattern() string { return r.Method + " " + r.Path }

// DocPath returns the path as the OpenAPI document names it: Path with a
// trailing "{name...}" written "{name}".
func (r Route) DocPath() string {
	if strings.HasSuffix(r.Path, "...}") {
		return strings.TrimSuffix(r.Path, "...}") + "}"
	}
	return r.Path
}

// The API's routes. The server registers exactly these and openapi.json
// documents exactly these (TestOpenAPI in this package checks the document; the server's tests check the registration).
var Routes = []Route{
	{"GET", "/healthz", "healthz", true},
	{"GET", "/openapi.json", "openapi", true},
	{"GET", "/metrics", "metrics", false},
	{"GET", "/v1/policy", "getPolicy", false},
	{"GET", "/v1/sandbox", "getSandbox", false},
	{"POST", "/v1/sessions", "createSession", false},
	{"GET", "/v1/sessions", "listSessions", false},
	{"GET", "/v1/sessions/{id}", "getSession", false},
	{"DELETE", "/v1/sessions/{id}", "destroySession", false},
	{"POST", "/v1/sessions/{id}/touch", "touchSession", false},
	{"POST", "/v1/sessions/{id}/exec", "exec", false},
	{"GET", "/v1/sessions/{id}/exec/stream", "execStream", false},
	{"PUT", "/v1/sessions/{id}/files", "putFile", false},
	{"GET", "/v1/sessions/{id}/files", "getFile", false},
	{"POST", "/v1/reap", "reap", false},
	{"GET", "/v1/workspaces", "listWorkspaces", false},
	{"DELETE", "/v1/workspaces/{key}", "removeWorkspace", false},
	{"POST", "/v1/images/pull", "pullImage", false},
	{"GET", "/v1/images", "listImages", false},
	{"DELETE", "/v1/images/{name...}", "removeImage", false},
	{"POST", "/v1/images/prune", "pruneImages", false},
}

// Headers and query parameters.
const (
	// HeaderRequestID carries the request id the server logs; a client may
	// set it, the server echoes it or makes one.
	HeaderRequestID = "X-Request-Id"
	// QueryPath names the file of the files routes.
	QueryPath = "path"
	// TrailerUploadFailed is a trailer a client declares on a chunked file
	// upload and sets (to a short reason) when its source fails midway: it
	// ends the body normally, and the server fails the put, cleaning up,
	// before it answers. So the client's call returns only once the old
	// content is back in place, with no temporary file left.
	TrailerUploadFailed = "Tai42-Upload-Failed"
	// ExecSubprotocol is the WebSocket subprotocol of the interactive exec.
	ExecSubprotocol = "tai42.exec.v1"
	// ContentTypeNDJSON is the media type of the pull's answer: one JSON
	// object per line.
	ContentTypeNDJSON = "application/x-ndjson"
	// DefaultPort is the daemon's default TCP port on 127.0.0.1.
	DefaultPort = 4242
)
