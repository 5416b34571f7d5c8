//go:build tools

// Pins echo-basic, the conformance backend that the node agent runs for the suite's Pods, to the
// same module version as the suite so build.sh can build it from this module.
package conformance

import _ "sigs.k8s.io/gateway-api/conformance/echo-basic"
