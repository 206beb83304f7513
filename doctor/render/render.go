// Package render writes check's results for people and machines: the
// verdict table, the JSON report, the --explain map of the layers and one
// pod's chain. It reads no evidence source and judges nothing.
package render

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/nvinject/nvinject/doctor/check"
	"github.com/nvinject/nvinject/shared/contract"
)

// maxEvidence bounds the evidence lines the table shows per layer; JSON
// carries all of them.
const maxEvidence = 8

// WriteTable writes the human table: one block per layer with its
// verdict, evidence and fix.
func WriteTable(w io.Writer, r check.Report) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "nvinject-doctor: node %s at %s\n", orDash(r.Node), r.Time.Format("2006-01-02T15:04:05Z"))
	fmt.Fprintln(tw, "LAYER\tVERDICT\tEVIDENCE / FIX")
	for _, v := range r.Verdicts {
		lines := v.Evidence
		if len(lines) > maxEvidence {
			lines = append(lines[:maxEvidence:maxEvidence], fmt.Sprintf("(%d more in --json)", len(v.Evidence)-maxEvidence))
		}
		if len(lines) == 0 {
			lines = []string{"-"}
		}
		for i, l := range lines {
			layer, status := "", ""
			if i == 0 {
				layer, status = string(v.Layer), strings.ToUpper(string(v.Status))
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\n", layer, status, oneLine(l))
		}
		if v.Fix != "" {
			fmt.Fprintf(tw, "\t\tfix: %s\n", oneLine(v.Fix))
		}
	}
	if b := r.Broken(); len(b) > 0 {
		fmt.Fprintf(tw, "broken: %v (start with the first: later layers depend on it)\n", b)
	}
	return tw.Flush()
}

// WriteJSON writes a Report or an ExplainReport as indented JSON.
func WriteJSON(w io.Writer, r any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

func oneLine(s string) string {
	return strings.Join(strings.Fields(s), " ")
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// WriteExplain writes what each layer means: the GPU troubleshooting
// row, the evidence the doctor reads for it, and what each verdict says.
func WriteExplain(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "LAYER\tTROUBLESHOOTING ROW (symptom → what to check)\tTHE DOCTOR READS")
	// The tables pair layer for layer; a DRA row of its own follows the
	// device plugin's where the layer reads DRA's objects.
	for i, c := range check.DevicePlugin {
		fmt.Fprintf(tw, "%s\t%s\t%s\n", c.Layer, c.Row, c.Reads)
		if d := check.DRA[i]; d.Symptom != c.Symptom || d.Reads != c.Reads {
			fmt.Fprintf(tw, "\tDRA node: %s\t%s\n", d.Symptom, d.Reads)
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	_, err := fmt.Fprintln(w, "\nOn a DRA-mode node (label "+contract.DRAModeLabel+"="+contract.DRAModeDRA+", or "+contract.DRAApp+" alone on it; --mode forces it) the layers marked \"DRA node\" read DRA's objects instead.\nVerdicts: OK the layer's evidence was read and holds; BROKEN a problem was found (the first broken layer is the one to fix first, later ones often follow from it); UNKNOWN some evidence could not be read (the FIX says which flag gives it).\nExit status: 0 no layer broken, 1 a layer broken or the doctor failed, 2 bad usage.")
	return err
}

// WriteExplanation writes the chain as text.
func WriteExplanation(w io.Writer, x check.Explanation) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "pod %s\n", x.Pod)
	for _, f := range x.Facts {
		fmt.Fprintf(tw, "  %s\n", oneLine(f))
	}
	for _, c := range x.Containers {
		fmt.Fprintf(tw, "\ncontainer %s\n", c.Name)
		for _, s := range c.Steps {
			if s.Label == check.StepNow && c.NoRecord != "" {
				fmt.Fprintf(tw, "  no record\t%s\n", oneLine(c.NoRecord))
			}
			fmt.Fprintf(tw, "  %s\t%s\n", s.Label, oneLine(s.Text))
		}
		for _, h := range c.History {
			fmt.Fprintf(tw, "  earlier\t%s\n", oneLine(h))
		}
	}
	return tw.Flush()
}
