// Command vllm-standin is a STAND-IN for the vLLM OpenAI server, used by the
// simulated local node. It does no inference: it finds the GPU it was given
// the way a CUDA program would (through the injected device node and the
// driver's nvidia-smi) and answers OpenAI-style completion requests with a
// canned text plus the GPU it sees, so tests can check which GPU a pod got.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/nvinject/nvinject/shared/cli"
	"github.com/nvinject/nvinject/shared/contract"
	"github.com/nvinject/nvinject/shared/logging"
)

// GPU is one GPU as the stand-in sees it.
type GPU struct {
	UUID   string `json:"uuid"`
	Name   string `json:"name"`
	Memory string `json:"memory"`
}

type server struct {
	model string
	gpus  []GPU
	env   []string
}

func main() {
	c := cli.New("vllm-standin", "[flags]", cli.WithAbout("A SIMULATED vLLM server for the local node: it runs no inference, it reports the GPU it found through nvidia-smi."))
	flag := c.Flags()
	addr := flag.String("addr", ":8000", "listen address")
	model := flag.String("model", "Qwen/Qwen2.5-0.5B-Instruct", "model name to report")
	smi := flag.String("nvidia-smi", "nvidia-smi", "nvidia-smi to query")
	var logFlags logging.Flags
	logFlags.Register(flag, logging.JSON)
	if err := c.Parse(os.Args[1:], nil); err != nil {
		os.Exit(cli.Code("vllm-standin", err, os.Stderr))
	}
	log, err := logFlags.Logger(os.Stdout)
	if err != nil {
		os.Exit(cli.Code("vllm-standin", cli.UsageError{Err: err}, os.Stderr))
	}
	gpus, err := probe(*smi)
	if err != nil {
		log.Error("CUDA initialization failed (vLLM stand-in, SIMULATED)", logging.Err(err))
		os.Exit(1)
	}
	s := &server{model: *model, gpus: gpus, env: uuidEnv(os.Environ())}
	log.Info("vLLM stand-in (SIMULATED, no inference) serving", "addr", *addr, "gpus", gpus, "injected", s.env)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	srv := &http.Server{Addr: *addr, Handler: s.routes(), ReadHeaderTimeout: 5 * time.Second}
	go func() {
		<-ctx.Done()
		shut, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = srv.Shutdown(shut)
	}()
	if err := srv.ListenAndServe(); err != nil && !errors.Is(err, http.ErrServerClosed) {
		log.Error("serve", logging.Err(err))
		os.Exit(1)
	}
}

// probe asks nvidia-smi which GPUs this container can reach, as the example's
// `nvidia-smi --query-gpu=uuid,name,memory.total --format=csv,noheader`.
func probe(smi string) ([]GPU, error) {
	out, err := exec.Command(smi, "--query-gpu=uuid,name,memory.total", "--format=csv,noheader").CombinedOutput()
	if err != nil {
		return nil, fmt.Errorf("%s: %w: %s", smi, err, strings.TrimSpace(string(out)))
	}
	var gpus []GPU
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Split(line, ", ")
		if len(f) != 3 {
			return nil, fmt.Errorf("unexpected nvidia-smi line %q", line)
		}
		gpus = append(gpus, GPU{UUID: f[0], Name: f[1], Memory: f[2]})
	}
	if len(gpus) == 0 {
		return nil, errors.New("no GPU visible")
	}
	return gpus, nil
}

func uuidEnv(env []string) []string {
	var out []string
	for _, e := range env {
		if strings.HasPrefix(e, contract.EnvUUIDPrefix) {
			out = append(out, e)
		}
	}
	sort.Strings(out)
	return out
}

func (s *server) routes() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })
	mux.HandleFunc("GET /v1/models", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, map[string]any{"object": "list", "data": []map[string]any{{"id": s.model, "object": "model", "owned_by": "vllm-standin"}}})
	})
	mux.HandleFunc("POST /v1/completions", s.complete)
	return mux
}

type completionRequest struct {
	Model     string `json:"model"`
	Prompt    string `json:"prompt"`
	MaxTokens int    `json:"max_tokens"`
}

func (s *server) complete(w http.ResponseWriter, r *http.Request) {
	var req completionRequest
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		http.Error(w, `{"error":"body must be a JSON completion request"}`, http.StatusBadRequest)
		return
	}
	if req.Model != "" && req.Model != s.model {
		http.Error(w, fmt.Sprintf(`{"error":"model %q is not served; use %q"}`, req.Model, s.model), http.StatusNotFound)
		return
	}
	text := fmt.Sprintf(" [vLLM stand-in, SIMULATED: no inference ran] on %s (%s)", s.gpus[0].UUID, s.gpus[0].Name)
	writeJSON(w, map[string]any{
		"id":       fmt.Sprintf("cmpl-standin-%d", time.Now().UnixNano()),
		"object":   "text_completion",
		"created":  time.Now().Unix(),
		"model":    s.model,
		"choices":  []map[string]any{{"index": 0, "text": text, "finish_reason": "length"}},
		"usage":    map[string]int{"prompt_tokens": len(strings.Fields(req.Prompt)), "completion_tokens": 0, "total_tokens": len(strings.Fields(req.Prompt))},
		"nvinject": map[string]any{"simulated": true, "nvidia_smi": s.gpus, "injected_env": s.env},
	})
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(v)
}
