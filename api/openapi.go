package api

import _ "embed"

// OpenAPI is the OpenAPI 3 document of the API (openapi.json beside this
// file), served at GET /openapi.json. TestOpenAPI checks it documents every
// route of [Routes] and every field of the wire types.
//
//go:embed openapi.json
var OpenAPI []byte
