//go:build nosim

package gpunode

// simulation: a release build has no simulation seam; an --nvml=sim:...
// value fails where the backend opens it, naming the equipment build.
func simulation(string) []Option { return nil }
