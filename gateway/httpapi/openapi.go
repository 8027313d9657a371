package httpapi

import _ "embed"

// OpenAPI is the API's OpenAPI 3 document (openapi.json beside this file, served at
// /openapi.json). It is generated from Routes: `go test ./gateway/httpapi -run TestOpenAPI
// -update` rewrites it, and the test fails while the two disagree.
//
//go:embed openapi.json
var OpenAPI []byte
