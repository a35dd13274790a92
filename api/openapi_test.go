package api

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/go-json-experiment/json/jsontext"

	"github.com/tai42/sandbox"
)

// TestOpenAPI checks openapi.json against the Go side of the wire format:
// the route table, the JSON bodies, the error kinds and the stream frames. A
// route, a field, a kind or a frame added on one side and not the other
// fails here.
func TestOpenAPI(t *testing.T) {
	doc := oaLoad(t)

	t.Run("document", func(t *testing.T) { oaCheckDocument(t, doc) })
	t.Run("routes", func(t *testing.T) { oaCheckRoutes(t, doc) })
	t.Run("security", func(t *testing.T) { oaCheckSecurity(t, doc) })
	t.Run("refs", func(t *testing.T) { oaCheckRefs(t, doc) })
	t.Run("parameters", func(t *testing.T) { oaCheckParameters(t, doc) })
	t.Run("schemas", func(t *testing.T) { oaCheckSchemas(t, doc) })
	t.Run("request bodies", func(t *testing.T) { oaCheckRequestBodies(t, doc) })
	t.Run("enums", func(t *testing.T) { oaCheckEnums(t, doc) })
	t.Run("errors", func(t *testing.T) { oaCheckErrors(t, doc) })
	t.Run("stream", func(t *testing.T) { oaCheckStream(t, doc) })
	t.Run("pull stream", func(t *testing.T) { oaCheckPullStream(t, doc) })
}

// oaCheckPullStream checks that the pull's 200 is the NDJSON stream of
// PullProgress lines and its PullEnd.
func oaCheckPullStream(t *testing.T, doc map[string]any) {
	r, ok := oaRoutes()["POST /v1/images/pull"]
	if !ok || r.OperationID != "pullImage" {
		t.Fatal("api.Routes has no POST /v1/images/pull (pullImage)")
	}
	op := oaOperations(doc)[oaPattern(r)]
	content := oaObj(oaObj(oaObj(op["responses"])["200"])["content"])
	if len(content) != 1 || content[ContentTypeNDJSON] == nil {
		t.Fatalf("pullImage: the 200 is %v; want only %s", slices.Collect(maps.Keys(content)), ContentTypeNDJSON)
	}
	var refs []any
	for _, s := range oaObj(oaObj(content[ContentTypeNDJSON])["schema"])["oneOf"].([]any) {
		refs = append(refs, oaObj(s)["$ref"])
	}
	if want := []any{"#/components/schemas/PullProgress", "#/components/schemas/PullEnd"}; !oaSameSet(refs, want) {
		t.Errorf("pullImage: the stream's lines are %v; want one of %v", refs, want)
	}
}

// oaLoad parses the embedded document, refusing duplicate keys (which
// encoding/json would silently resolve to the last one).
func oaLoad(t *testing.T) map[string]any {
	t.Helper()
	var doc map[string]any
	if err := json.Unmarshal(OpenAPI, &doc); err != nil {
		t.Fatalf("openapi.json is not valid JSON: %v", err)
	}
	if err := oaNoDuplicateKeys(OpenAPI); err != nil {
		t.Fatalf("openapi.json: %v", err)
	}
	return doc
}

// oaNoDuplicateKeys reports the first object key that appears twice in the
// same object of the JSON text b (JSON v2's reader refuses it, naming where)
// and data after the document.
func oaNoDuplicateKeys(b []byte) error {
	dec := jsontext.NewDecoder(bytes.NewReader(b))
	if err := dec.SkipValue(); err != nil {
		return err
	}
	if _, err := dec.ReadToken(); !errors.Is(err, io.EOF) {
		return fmt.Errorf("trailing data after the document")
	}
	return nil
}

func TestOANoDuplicateKeys(t *testing.T) {
	for doc, want := range map[string]string{
		`{"a":{"b":[1,{"c":1}]},"d":2}`: "",
		`{"a":{"b":[1,{"c":1,"c":2}]}}`: `duplicate object member name "c" within "/a/b/1"`,
		`{"a":1,"\u0061":2}`:            `duplicate object member name "a"`,
		`{"a":1} {}`:                    "trailing data",
		`{"a":`:                         "unexpected EOF",
	} {
		err := oaNoDuplicateKeys([]byte(doc))
		if want == "" && err != nil || want != "" && (err == nil || !strings.Contains(err.Error(), want)) {
			t.Errorf("%s: %v, want %q", doc, err, want)
		}
	}
}

func oaCheckDocument(t *testing.T, doc map[string]any) {
	if v, _ := doc["openapi"].(string); !strings.HasPrefix(v, "3.") {
		t.Errorf(`"openapi" = %q, want a 3.x version`, v)
	}
	info := oaObj(doc["info"])
	for _, k := range []string{"title", "version"} {
		if s, _ := info[k].(string); s == "" {
			t.Errorf("info.%s is not set", k)
		}
	}
	want := "http://127.0.0.1:" + strconv.Itoa(DefaultPort)
	servers, _ := doc["servers"].([]any)
	if len(servers) == 0 || oaObj(servers[0])["url"] != want {
		t.Errorf("servers[0].url is not %q (DefaultPort)", want)
	}
}

var oaMethods = []string{"get", "put", "post", "delete", "options", "head", "patch", "trace"}

// oaOperations returns every operation of the document by "METHOD PATH".
func oaOperations(doc map[string]any) map[string]map[string]any {
	ops := map[string]map[string]any{}
	for path, item := range oaObj(doc["paths"]) {
		for method, op := range oaObj(item) {
			if slices.Contains(oaMethods, method) {
				ops[strings.ToUpper(method)+" "+path] = oaObj(op)
			}
		}
	}
	return ops
}

// oaPattern is "METHOD PATH" of r as the document names it (DocPath).
func oaPattern(r Route) string { return r.Method + " " + r.DocPath() }

func oaRoutes() map[string]Route {
	m := map[string]Route{}
	for _, r := range Routes {
		m[oaPattern(r)] = r
	}
	return m
}

func oaCheckRoutes(t *testing.T, doc map[string]any) {
	paths := oaObj(doc["paths"])
	for _, r := range Routes {
		item, ok := paths[r.DocPath()].(map[string]any)
		if !ok {
			t.Errorf("route %s (%s) is not documented: no path %q in openapi.json", r.Pattern(), r.OperationID, r.DocPath())
			continue
		}
		op, ok := item[strings.ToLower(r.Method)].(map[string]any)
		if !ok {
			t.Errorf("route %s (%s) is not documented: path %q has no %q operation", r.Pattern(), r.OperationID, r.DocPath(), strings.ToLower(r.Method))
			continue
		}
		if got := op["operationId"]; got != r.OperationID {
			t.Errorf("%s: operationId = %v, want %q (api.Routes)", r.Pattern(), got, r.OperationID)
		}
	}

	// The other direction: nothing documented that the server does not serve.
	routes := oaRoutes()
	pathItemKeys := []string{"summary", "description", "servers", "parameters"}
	ids := map[string]string{}
	for path, item := range paths {
		for key := range oaObj(item) {
			switch {
			case slices.Contains(oaMethods, key):
				p := strings.ToUpper(key) + " " + path
				if _, ok := routes[p]; !ok {
					t.Errorf("openapi.json documents %s, which is not in api.Routes", p)
				}
			case slices.Contains(pathItemKeys, key), strings.HasPrefix(key, "x-"):
			default:
				t.Errorf("path %q has key %q, which is neither an HTTP method nor a path item field", path, key)
			}
		}
	}
	for p, op := range oaOperations(doc) {
		id, _ := op["operationId"].(string)
		if prev, dup := ids[id]; dup {
			t.Errorf("operationId %q is used by both %s and %s", id, prev, p)
		}
		ids[id] = p
	}
}

func oaCheckSecurity(t *testing.T, doc map[string]any) {
	scheme := oaObj(oaObj(oaObj(doc["components"])["securitySchemes"])["bearerAuth"])
	if scheme["type"] != "http" || scheme["scheme"] != "bearer" {
		t.Errorf("components.securitySchemes.bearerAuth = %v, want an http bearer scheme", scheme)
	}
	global, _ := doc["security"].([]any)
	if len(global) != 1 || oaObj(global[0])["bearerAuth"] == nil || len(oaObj(global[0])) != 1 {
		t.Errorf("the global security = %v, want [{\"bearerAuth\": []}]", doc["security"])
	}
	ops := oaOperations(doc)
	for _, r := range Routes {
		op, ok := ops[oaPattern(r)]
		if !ok {
			continue // reported by oaCheckRoutes
		}
		sec, has := op["security"]
		responses := oaObj(op["responses"])
		_, has401 := responses["401"]
		if r.Public {
			if list, ok := sec.([]any); !has || !ok || len(list) != 0 {
				t.Errorf("%s is public: want \"security\": [] on the operation, got %v", r.Pattern(), sec)
			}
			if has401 {
				t.Errorf("%s is public but lists a 401 response", r.Pattern())
			}
			continue
		}
		if has {
			t.Errorf("%s needs the bearer token: it must not override the global security, got \"security\": %v", r.Pattern(), sec)
		}
		if !has401 {
			t.Errorf("%s needs the bearer token but lists no 401 response", r.Pattern())
		}
	}
}

// oaWalk calls f on every object of v, with its JSON pointer.
func oaWalk(v any, at string, f func(at string, m map[string]any)) {
	switch v := v.(type) {
	case map[string]any:
		f(at, v)
		for k, e := range v {
			oaWalk(e, at+"/"+oaEscape(k), f)
		}
	case []any:
		for i, e := range v {
			oaWalk(e, at+"/"+strconv.Itoa(i), f)
		}
	}
}

// oaResolve follows a local reference "#/a/b" in doc.
func oaResolve(doc map[string]any, ref string) (any, bool) {
	if !strings.HasPrefix(ref, "#/") {
		return nil, false
	}
	var cur any = doc
	for _, part := range strings.Split(ref[2:], "/") {
		part = strings.NewReplacer("~1", "/", "~0", "~").Replace(part)
		switch c := cur.(type) {
		case map[string]any:
			v, ok := c[part]
			if !ok {
				return nil, false
			}
			cur = v
		case []any:
			i, err := strconv.Atoi(part)
			if err != nil || i < 0 || i >= len(c) {
				return nil, false
			}
			cur = c[i]
		default:
			return nil, false
		}
	}
	return cur, true
}

// oaDeref resolves v when it is a {"$ref": ...} object.
func oaDeref(doc map[string]any, v any) map[string]any {
	m := oaObj(v)
	if ref, ok := m["$ref"].(string); ok {
		if r, ok := oaResolve(doc, ref); ok {
			return oaObj(r)
		}
	}
	return m
}

func oaCheckRefs(t *testing.T, doc map[string]any) {
	n := 0
	oaWalk(doc, "#", func(at string, m map[string]any) {
		v, ok := m["$ref"]
		if !ok {
			return
		}
		n++
		ref, _ := v.(string)
		if !strings.HasPrefix(ref, "#/components/") {
			t.Errorf("%s: $ref %v does not point into #/components/", at, v)
			return
		}
		if _, ok := oaResolve(doc, ref); !ok {
			t.Errorf("%s: $ref %q does not resolve", at, ref)
		}
	})
	if n == 0 {
		t.Error("the document has no $ref at all")
	}
}

var oaPathParam = regexp.MustCompile(`\{([^}]+)\}`)

func oaCheckParameters(t *testing.T, doc map[string]any) {
	paths := oaObj(doc["paths"])
	ops := oaOperations(doc)
	for _, r := range Routes {
		op, ok := ops[oaPattern(r)]
		if !ok {
			continue
		}
		// Declared parameters: the path item's, overridden by the operation's.
		declared := map[string]map[string]any{}
		for _, list := range []any{oaObj(paths[r.DocPath()])["parameters"], op["parameters"]} {
			ps, _ := list.([]any)
			for _, p := range ps {
				p := oaDeref(doc, p)
				name, _ := p["name"].(string)
				in, _ := p["in"].(string)
				if name == "" || in == "" {
					t.Errorf("%s: a parameter has no name or no in: %v", r.Pattern(), p)
					continue
				}
				declared[in+":"+name] = p
			}
		}
		inPath := map[string]bool{}
		for _, m := range oaPathParam.FindAllStringSubmatch(r.DocPath(), -1) {
			inPath[m[1]] = true
			p, ok := declared["path:"+m[1]]
			if !ok {
				t.Errorf("%s: path parameter %q is not declared", r.Pattern(), m[1])
			} else if p["required"] != true {
				t.Errorf("%s: path parameter %q is not required: true", r.Pattern(), m[1])
			}
		}
		for key := range declared {
			if name, ok := strings.CutPrefix(key, "path:"); ok && !inPath[name] {
				t.Errorf("%s: declares path parameter %q, which is not in the path", r.Pattern(), name)
			}
		}
		if strings.HasSuffix(r.Path, "/files") {
			p, ok := declared["query:"+QueryPath]
			if !ok || p["required"] != true {
				t.Errorf("%s: the files routes need the required query parameter %q", r.Pattern(), QueryPath)
			}
		}
	}
}

// oaWireTypes maps each component schema to the Go type it documents.
var oaWireTypes = map[string]reflect.Type{
	"SessionSpec":   reflect.TypeFor[SessionSpec](),
	"ExecRequest":   reflect.TypeFor[ExecRequest](),
	"ExecResult":    reflect.TypeFor[ExecResult](),
	"SessionList":   reflect.TypeFor[SessionList](),
	"Reaped":        reflect.TypeFor[Reaped](),
	"SandboxInfo":   reflect.TypeFor[SandboxInfo](),
	"Health":        reflect.TypeFor[Health](),
	"Error":         reflect.TypeFor[Error](),
	"ErrorBody":     reflect.TypeFor[ErrorBody](),
	"Frame":         reflect.TypeFor[Frame](),
	"SessionInfo":   reflect.TypeFor[sandbox.SessionInfo](),
	"Policy":        reflect.TypeFor[sandbox.Policy](),
	"WorkspaceList": reflect.TypeFor[WorkspaceList](),
	"WorkspaceInfo": reflect.TypeFor[sandbox.WorkspaceInfo](),
	"PolicyInfo":    reflect.TypeFor[PolicyInfo](),
	"EgressFences":  reflect.TypeFor[EgressFences](),
	"DiskCap":       reflect.TypeFor[DiskCap](),
	"PullRequest":   reflect.TypeFor[PullRequest](),
	"PullEnd":       reflect.TypeFor[PullEnd](),
	"PullProgress":  reflect.TypeFor[sandbox.PullProgress](),
	"ImageInfo":     reflect.TypeFor[sandbox.ImageInfo](),
	"ImageList":     reflect.TypeFor[ImageList](),
	"PruneResult":   reflect.TypeFor[sandbox.PruneResult](),
}

// oaEnums are the enum schemas and the contract's values of each.
var oaEnums = map[string][]any{
	"Durability":   {string(sandbox.Ephemeral), string(sandbox.Persistent)},
	"Network":      {string(sandbox.NetworkNone), string(sandbox.NetworkInternal), string(sandbox.NetworkEgress)},
	"Isolation":    {string(sandbox.IsolationNone), string(sandbox.IsolationContainer), string(sandbox.IsolationVM), nil},
	"RejectReason": {string(sandbox.ReasonInvalid), string(sandbox.ReasonPolicy), string(sandbox.ReasonUnenforceable), string(sandbox.ReasonConflict)},
	"PullReason": {string(sandbox.PullInvalidReference), string(sandbox.PullNotFound), string(sandbox.PullUnauthorized),
		string(sandbox.PullNoPlatform), string(sandbox.PullInvalidImage), string(sandbox.PullUnreachable), string(sandbox.PullStorage)},
	"PullStatus": {string(sandbox.PullResolved), string(sandbox.PullLayerExists), string(sandbox.PullLayerFetching),
		string(sandbox.PullLayerDone), string(sandbox.PullComplete)},
}

// oaJSONNames returns the JSON names of t's fields as encoding/json sees
// them, embedded structs inlined; "-" is left out.
func oaJSONNames(t reflect.Type) []string {
	var names []string
	for f := range t.Fields() {
		tag, hasTag := f.Tag.Lookup("json")
		name, _, _ := strings.Cut(tag, ",")
		if tag == "-" {
			continue
		}
		if f.Anonymous && name == "" {
			ft := f.Type
			if ft.Kind() == reflect.Pointer {
				ft = ft.Elem()
			}
			if ft.Kind() == reflect.Struct {
				names = append(names, oaJSONNames(ft)...)
				continue
			}
		}
		if !f.IsExported() {
			continue
		}
		if !hasTag || name == "" {
			name = f.Name
		}
		names = append(names, name)
	}
	sort.Strings(names)
	return names
}

func oaCheckSchemas(t *testing.T, doc map[string]any) {
	schemas := oaObj(oaObj(doc["components"])["schemas"])
	for name := range schemas {
		if oaWireTypes[name] == nil && oaEnums[name] == nil {
			t.Errorf("components.schemas.%s documents no Go wire type or contract enum this test knows; add it to oaWireTypes or oaEnums", name)
		}
	}
	for name, typ := range oaWireTypes {
		s, ok := schemas[name].(map[string]any)
		if !ok {
			t.Errorf("components.schemas.%s (%v) is missing", name, typ)
			continue
		}
		want := oaJSONNames(typ)
		got := slices.Sorted(maps.Keys(oaObj(s["properties"])))
		for _, n := range want {
			if !slices.Contains(got, n) {
				t.Errorf("components.schemas.%s lacks property %q, a field of %v", name, n, typ)
			}
		}
		for _, n := range got {
			if !slices.Contains(want, n) {
				t.Errorf("components.schemas.%s has property %q, which %v has no field for", name, n, typ)
			}
		}
		req, _ := s["required"].([]any)
		for _, r := range req {
			if n, _ := r.(string); !slices.Contains(want, n) {
				t.Errorf("components.schemas.%s requires %v, which %v has no field for", name, r, typ)
			}
		}
	}
}

// oaCheckRequestBodies checks that every JSON request body refuses unknown
// fields, as the server does.
func oaCheckRequestBodies(t *testing.T, doc map[string]any) {
	for p, op := range oaOperations(doc) {
		rb := oaDeref(doc, op["requestBody"])
		for media, c := range oaObj(rb["content"]) {
			if media != "application/json" {
				continue
			}
			s := oaDeref(doc, oaObj(c)["schema"])
			if s["additionalProperties"] != false {
				t.Errorf("%s: the JSON request body's schema does not set additionalProperties: false (the server refuses unknown fields)", p)
			}
		}
	}
}

func oaCheckEnums(t *testing.T, doc map[string]any) {
	schemas := oaObj(oaObj(doc["components"])["schemas"])
	for name, want := range oaEnums {
		got, _ := oaObj(schemas[name])["enum"].([]any)
		if !oaSameSet(got, want) {
			t.Errorf("components.schemas.%s enum = %v, want the contract's %v", name, got, want)
		}
	}
}

func oaCheckErrors(t *testing.T, doc map[string]any) {
	schemas := oaObj(oaObj(doc["components"])["schemas"])
	got, _ := oaObj(oaObj(oaObj(schemas["Error"])["properties"])["kind"])["enum"].([]any)
	var want []any
	statuses := map[int]bool{}
	for k, s := range KindStatus {
		want = append(want, string(k))
		statuses[s] = true
	}
	slices.SortFunc(want, func(a, b any) int { return strings.Compare(a.(string), b.(string)) })
	if !oaSameSet(got, want) {
		t.Errorf("components.schemas.Error kind enum = %v, want the kinds of api.KindStatus %v", got, want)
	}

	for p, op := range oaOperations(doc) {
		for code, resp := range oaObj(op["responses"]) {
			status, err := strconv.Atoi(code)
			if err != nil {
				t.Errorf("%s: response %q is not a numeric status", p, code)
				continue
			}
			if status < http.StatusBadRequest {
				continue
			}
			if !statuses[status] {
				t.Errorf("%s: documents error status %d, which api.KindStatus gives no kind", p, status)
			}
			r := oaDeref(doc, resp)
			ref := oaObj(oaObj(oaObj(r["content"])["application/json"])["schema"])["$ref"]
			if ref != "#/components/schemas/ErrorBody" || len(oaObj(r["content"])) != 1 {
				t.Errorf("%s: error response %d is not application/json ErrorBody", p, status)
			}
		}
	}
}

func oaCheckStream(t *testing.T, doc map[string]any) {
	var stream *Route
	for _, r := range Routes {
		if r.OperationID == "execStream" {
			stream = &r
		}
	}
	if stream == nil {
		t.Fatal("api.Routes has no execStream route")
	}
	op, ok := oaOperations(doc)[oaPattern(*stream)]
	if !ok {
		t.Fatalf("%s is not documented", stream.Pattern())
	}
	if _, ok := oaObj(op["responses"])["101"]; !ok {
		t.Errorf("%s: no 101 response", stream.Pattern())
	}
	if got := op["x-websocket-subprotocol"]; got != ExecSubprotocol {
		t.Errorf("%s: x-websocket-subprotocol = %v, want %q", stream.Pattern(), got, ExecSubprotocol)
	}
	if got, _ := op["x-websocket-max-client-frame-bytes"].(float64); got != MaxClientFrame {
		t.Errorf("%s: x-websocket-max-client-frame-bytes = %v, want %d (MaxClientFrame)", stream.Pattern(), got, MaxClientFrame)
	}
	if d, _ := op["description"].(string); !strings.Contains(d, ExecSubprotocol) {
		t.Errorf("%s: the description does not name the subprotocol %q", stream.Pattern(), ExecSubprotocol)
	}

	frames, _ := op["x-websocket-frames"].([]any)
	var text, binary []any
	for _, f := range frames {
		f := oaObj(f)
		if f["schema"] == nil || f["description"] == nil {
			t.Errorf("x-websocket-frames: frame %v has no schema or no description", f["name"])
		}
		switch f["opcode"] {
		case "text":
			text = append(text, f["type"])
		case "binary":
			binary = append(binary, f["tag"])
		default:
			t.Errorf("x-websocket-frames: frame %v has opcode %v, want text or binary", f["name"], f["opcode"])
		}
	}
	wantText := []any{FrameStart, FrameStarted, FrameCloseStdin, FrameKill, FrameAck, FrameExit, FrameError}
	if !oaSameSet(text, wantText) {
		t.Errorf("x-websocket-frames text types = %v, want the Frame* constants %v", text, wantText)
	}
	wantBinary := []any{float64(TagStdin), float64(TagStdout), float64(TagStderr)}
	if !oaSameSet(binary, wantBinary) {
		t.Errorf("x-websocket-frames binary tags = %v, want the Tag* constants %v", binary, wantBinary)
	}
	// The Frame schema covers every text frame but start (an ExecRequest).
	got, _ := oaObj(oaObj(oaObj(oaObj(oaObj(doc["components"])["schemas"])["Frame"])["properties"])["type"])["enum"].([]any)
	if !oaSameSet(got, wantText[1:]) {
		t.Errorf("components.schemas.Frame type enum = %v, want %v", got, wantText[1:])
	}
}

// oaEscape escapes k as a JSON pointer token.
func oaEscape(k string) string { return strings.NewReplacer("~", "~0", "/", "~1").Replace(k) }

func oaObj(v any) map[string]any {
	m, _ := v.(map[string]any)
	return m
}

// oaSameSet reports whether a and b hold the same values, ignoring order;
// duplicates make them differ.
func oaSameSet(a, b []any) bool {
	key := func(s []any) []string {
		out := make([]string, len(s))
		for i, v := range s {
			out[i] = fmt.Sprintf("%T:%v", v, v)
		}
		sort.Strings(out)
		return out
	}
	return slices.Equal(key(a), key(b))
}
