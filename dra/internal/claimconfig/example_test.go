package claimconfig

import (
	"bytes"
	"os"
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"sigs.k8s.io/yaml"
)

// The example manifest's claim config parses as TimeSlicing, and both of
// its pods reference that one claim (not a template).
func TestSharedClaimExample(t *testing.T) {
	data, err := os.ReadFile("../../../deploy/examples/dra/shared-gpu-claim.yaml")
	if err != nil {
		t.Fatal(err)
	}
	docs := bytes.Split(data, []byte("\n---\n"))
	if len(docs) != 3 {
		t.Fatalf("%d documents, want the claim and two pods", len(docs))
	}
	var claim resourceapi.ResourceClaim
	if err := yaml.UnmarshalStrict(docs[0], &claim); err != nil {
		t.Fatal(err)
	}
	cfgs := claim.Spec.Devices.Config
	if len(cfgs) != 1 || cfgs[0].Opaque == nil {
		t.Fatalf("config %+v, want one opaque config", cfgs)
	}
	c, err := Parse(claim.Namespace+"/"+claim.Name, cfgs[0].Opaque.Parameters.Raw)
	if err != nil || c.Strategy() != TimeSlicing {
		t.Fatalf("example config: %+v, %v; want TimeSlicing", c, err)
	}
	for _, doc := range docs[1:] {
		var p corev1.Pod
		if err := yaml.UnmarshalStrict(doc, &p); err != nil {
			t.Fatal(err)
		}
		rc := p.Spec.ResourceClaims
		if len(rc) != 1 || rc[0].ResourceClaimName == nil || *rc[0].ResourceClaimName != claim.Name || p.Spec.Containers[0].Resources.Claims[0].Name != rc[0].Name {
			t.Errorf("pod %s does not reference claim %s by name", p.Name, claim.Name)
		}
	}
}
