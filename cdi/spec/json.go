package spec

import (
	"encoding/json"

	specs "tags.cncf.io/container-device-interface/specs-go"
)

// mustJSON encodes a spec; the types are plain data, so it cannot fail.
func mustJSON(s *specs.Spec) []byte {
	b, err := json.Marshal(s)
	if err != nil {
		panic(err)
	}
	return b
}
