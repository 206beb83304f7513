package nodemove

import (
	"context"
	"errors"
	"log/slog"
	"testing"

	"github.com/nvinject/nvinject/shared/contract"
)

type fakeAPI struct {
	labels           map[string]string
	getErr, delErr   error
	deleted, lookups int
}

func (f *fakeAPI) NodeLabels(context.Context, string) (map[string]string, error) {
	f.lookups++
	return f.labels, f.getErr
}

func (f *fakeAPI) DeleteSlices(context.Context, string) error {
	f.deleted++
	return f.delErr
}

// A node whose owner label no longer says dra loses its slices at once; a
// DRA node's restart, an unreadable Node or no owner label keeps them.
func TestReleaseIfMovedAway(t *testing.T) {
	const label = contract.DRAModeLabel
	for _, tt := range []struct {
		name        string
		ownerLabel  string
		api         fakeAPI
		wantDeleted int
	}{
		{"still a DRA node", label, fakeAPI{labels: map[string]string{label: contract.DRAModeDRA}}, 0},
		{"moved to the device plugin", label, fakeAPI{labels: map[string]string{label: contract.DRAModeDevicePlugin}}, 1},
		{"label removed", label, fakeAPI{labels: map[string]string{}}, 1},
		{"Node unreadable", label, fakeAPI{getErr: errors.New("forbidden")}, 0},
		{"delete fails", label, fakeAPI{labels: map[string]string{}, delErr: errors.New("forbidden")}, 1},
		{"no owner label", "", fakeAPI{labels: map[string]string{}}, 0},
	} {
		t.Run(tt.name, func(t *testing.T) {
			ReleaseIfMovedAway(&tt.api, "node-a", tt.ownerLabel, slog.New(slog.DiscardHandler))
			if tt.api.deleted != tt.wantDeleted {
				t.Errorf("deleted %d times, want %d", tt.api.deleted, tt.wantDeleted)
			}
			if tt.ownerLabel == "" && tt.api.lookups != 0 {
				t.Errorf("read the Node without an owner label")
			}
		})
	}
}
