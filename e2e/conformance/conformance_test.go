// Package conformance runs the Gateway API conformance suite (v1.6.3) against the cluster in
// $KUBECONFIG with the flags of sigs.k8s.io/gateway-api/conformance/utils/flags (gateway class,
// profiles, supported features, report output and implementation details). run.sh drives it.
package conformance

import (
	"testing"

	"sigs.k8s.io/gateway-api/conformance"
)

func TestConformance(t *testing.T) { conformance.RunConformance(t) }
