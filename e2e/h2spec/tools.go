//go:build tools

// Package tools pins h2spec (the HTTP/2 conformance checker that e2e/h2spec.sh runs) and,
// through go.mod and go.sum, every module it is built from.
package tools

import _ "github.com/summerwind/h2spec/cmd/h2spec"
