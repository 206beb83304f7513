package devices

// Preferred picks size device IDs from available, keeping every one of
// mustInclude, so that the chosen GPUs are as close as the cached topology
// allows. It never fails: IDs it does not know are skipped, and when too few
// remain it returns what it has, leaving the rest to kubelet.
func (t *Table) Preferred(available, mustInclude []string, size int) []string {
	chosen := t.known(mustInclude)
	if size <= len(chosen) {
		return t.ids(chosen)
	}
	inChosen := map[int]bool{}
	for _, i := range chosen {
		inChosen[i] = true
	}
	var cands []int
	for _, i := range t.known(available) {
		if !inChosen[i] {
			cands = append(cands, i)
		}
	}
	if len(chosen)+len(cands) <= size {
		return t.ids(append(chosen, cands...))
	}
	if len(chosen) > 0 {
		best, _ := t.grow(chosen, cands, size)
		return t.ids(best)
	}
	var best []int
	bestScore := -1
	for k, seed := range cands {
		rest := append(append([]int{}, cands[:k]...), cands[k+1:]...)
		set, s := t.grow([]int{seed}, rest, size)
		if s > bestScore {
			best, bestScore = set, s
		}
	}
	return t.ids(best)
}

// grow adds, one at a time, the candidate closest to the chosen set.
func (t *Table) grow(chosen, cands []int, size int) ([]int, int) {
	chosen = append([]int{}, chosen...)
	left := append([]int{}, cands...)
	total := t.setScore(chosen)
	for len(chosen) < size && len(left) > 0 {
		bi, bs := 0, -1
		for k, c := range left {
			s := 0
			for _, x := range chosen {
				s += t.score[x][c]
			}
			if s > bs {
				bi, bs = k, s
			}
		}
		chosen = append(chosen, left[bi])
		total += bs
		left = append(left[:bi], left[bi+1:]...)
	}
	return chosen, total
}

func (t *Table) setScore(set []int) int {
	s := 0
	for i, a := range set {
		for _, b := range set[i+1:] {
			s += t.score[a][b]
		}
	}
	return s
}

// known maps IDs to table positions, dropping unknown and repeated IDs.
func (t *Table) known(ids []string) []int {
	seen := map[int]bool{}
	var out []int
	for _, id := range ids {
		if i, ok := t.byID[id]; ok && !seen[i] {
			seen[i] = true
			out = append(out, i)
		}
	}
	return out
}

func (t *Table) ids(set []int) []string {
	out := make([]string, len(set))
	for k, i := range set {
		out[k] = t.entries[i].ID
	}
	return out
}
