package fleet

import (
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/nvinject/nvinject/shared/contract"
)

// WriteTable writes one line per row, and the first broken layer's fix
// under a broken one.
func WriteTable(w io.Writer, rows []Row) error {
	if len(rows) == 0 {
		_, err := fmt.Fprintf(w, "no GPU node: none is labelled %s=true, has a %s resource or a ResourceSlice of driver %s\n", contract.GFDLabelPresent, resourceDomain, contract.DRADriver)
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NODE\tMODE\tMODEL\tGPUS\tDRIVER\tSTATUS\tBROKEN LAYER / FIX")
	broken := 0
	for _, r := range rows {
		layer := "-"
		if r.Status == StatusBroken {
			broken++
			layer = r.Layer + ": " + oneLine(r.Reason)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d/%d\t%s\t%s\t%s\n", r.Node, r.Mode, cmp.Or(r.Model, "-"), r.Published, r.Healthy, cmp.Or(r.Driver, "-"), r.Status, layer)
		if r.Fix != "" {
			fmt.Fprintf(tw, "\t\t\t\t\t\tfix: %s\n", oneLine(r.Fix))
		}
	}
	fmt.Fprintf(tw, "%d GPU nodes: %d ok, %d broken (GPUS is published/healthy)\n", len(rows), len(rows)-broken, broken)
	return tw.Flush()
}

// WriteJSON writes the rows as a JSON array, [] when there are none.
func WriteJSON(w io.Writer, rows []Row) error {
	if rows == nil {
		rows = []Row{}
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(rows)
}

func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }
