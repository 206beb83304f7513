package move

import (
	"context"
	"fmt"
	"slices"
	"sync"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Nodes are the names of the nodes selector matches, sorted.
func (m *Mover) Nodes(ctx context.Context, selector string) ([]string, error) {
	list, err := m.c.CoreV1().Nodes().List(ctx, metav1.ListOptions{LabelSelector: selector})
	if err != nil {
		return nil, fmt.Errorf("nodes %q: %w", selector, err)
	}
	var out []string
	for _, n := range list.Items {
		out = append(out, n.Name)
	}
	slices.Sort(out)
	if len(out) == 0 {
		return nil, fmt.Errorf("no node matches --selector=%q", selector)
	}
	return out, nil
}

// Roll runs each node through do, at most maxUnavailable at a time, in order, and
// stops after the first batch in which a node failed: the nodes after it are left as
// they are, the failed one cordoned with its reason.
func Roll(ctx context.Context, nodes []string, maxUnavailable int, do func(context.Context, string) (Report, error)) ([]Report, error) {
	if maxUnavailable < 1 {
		return nil, fmt.Errorf("--max-unavailable=%d: give 1 or more", maxUnavailable)
	}
	var reports []Report
	for batch := range slices.Chunk(nodes, maxUnavailable) {
		out := make([]Report, len(batch))
		errs := make([]error, len(batch))
		var wg sync.WaitGroup
		for i, n := range batch {
			wg.Go(func() { out[i], errs[i] = do(ctx, n) })
		}
		wg.Wait()
		reports = append(reports, out...)
		for i, err := range errs {
			if err != nil {
				done := 0
				for _, r := range reports {
					if r.Error == "" {
						done++
					}
				}
				return reports, fmt.Errorf("node %s failed and the roll stops (%d of %d nodes done): %w", batch[i], done, len(nodes), err)
			}
		}
	}
	return reports, nil
}
