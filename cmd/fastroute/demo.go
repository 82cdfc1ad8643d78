package main

import (
	"bufio"
	_ "embed"
	"encoding/base64"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/fastroute/fastroute/bench/mockworker"
	"github.com/fastroute/fastroute/dataplane"
	"github.com/fastroute/fastroute/dataplane/config"
	"github.com/fastroute/fastroute/dataplane/router"
	"github.com/fastroute/fastroute/internal/otlpsink"
	"golang.org/x/net/websocket"
)

//go:embed demo.yaml
var demoConfig []byte

func runDemo(args []string) error {
	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
	requests := fs.Int("requests", 9, "requests to send (a third of them streaming)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	cfg, err := config.Parse("demo.yaml (embedded)", demoConfig)
	if err != nil {
		return err
	}
	mocks := make([]*mockworker.Worker, len(cfg.Workers))
	for i := range cfg.Workers {
		spec := &cfg.Workers[i]
		// Simulated engines: GPU-like ones with 8 running slots, the CPU
		// one at 1/6 of their speed with 2.
		engine := mockworker.EngineOptions{MaxNumSeqs: 8, InterTokenLatency: 15 * time.Millisecond, Speed: 1, PrefixCache: true}
		if spec.Device == "cpu" {
			engine.MaxNumSeqs, engine.Speed = 2, 1.0/6
		}
		m, err := mockworker.Start("127.0.0.1:0", mockworker.Options{ID: spec.ID, Tokens: 6, LoRAs: spec.LoRAs, Engine: engine})
		if err != nil {
			return err
		}
		defer m.Close()
		mocks[i] = m
		spec.URL = m.URL()
	}
	// An OpenTelemetry collector's receiver in miniature: every request's
	// span goes there.
	sink, err := otlpsink.Start()
	if err != nil {
		return err
	}
	defer sink.Close()
	cfg.Tracing.OTLPEndpoint = sink.URL()
	r, err := router.Start(cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		return err
	}
	defer r.Close()
	fmt.Printf("fastroute demo: router on %s (admin %s), mode %s, %d mock workers\n\n",
		r.Addr(), r.AdminAddr(), cfg.Router.Mode, len(mocks))

	// Wait for a first reading of every engine's metrics.
	for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		read := 0
		for _, w := range r.Registry.All() {
			if w.Engine() != nil {
				read++
			}
		}
		if read == len(mocks) {
			break
		}
	}

	base := "http://" + r.Addr()
	client := &http.Client{Timeout: 10 * time.Second}
	for i := 0; i < *requests; i++ {
		stream := i%3 == 2
		line, err := demoRequest(client, base, i+1, stream)
		if err != nil {
			return fmt.Errorf("request %d: %w", i+1, err)
		}
		fmt.Println(line)
	}
	line, err := demoEmbedding(client, base)
	if err != nil {
		return err
	}
	fmt.Println(line)
	q, err := demoQuery(client, base)
	if err != nil {
		return err
	}
	fmt.Println(q)
	rt, err := demoRealtime(r.Addr())
	if err != nil {
		return fmt.Errorf("realtime session: %w", err)
	}
	fmt.Println(rt)
	sticky, err := demoSticky(client, base)
	if err != nil {
		return err
	}
	fmt.Println(sticky)
	slept, err := demoSleep(client, base, r.Registry, cfg.Workers[0].ID, mocks[0])
	if err != nil {
		return fmt.Errorf("sleep mode: %w", err)
	}
	fmt.Println(slept)
	down, err := demoDown(client, base, r.AdminAddr(), cfg.Workers[1].ID)
	if err != nil {
		return fmt.Errorf("worker down: %w", err)
	}
	fmt.Println(down)
	conv, err := demoConversation(client, []string{base}, nil, mocks)
	if err != nil {
		return fmt.Errorf("conversation: %w", err)
	}
	fmt.Println(conv)
	split, err := demoDisagg(client)
	if err != nil {
		return fmt.Errorf("disaggregated request: %w", err)
	}
	fmt.Println(split)
	keys, err := demoKeys(client)
	if err != nil {
		return fmt.Errorf("api keys: %w", err)
	}
	fmt.Println(keys)
	alias, err := demoAlias(client, base)
	if err != nil {
		return fmt.Errorf("model alias: %w", err)
	}
	fmt.Println(alias)
	traced, err := demoTrace(client, base, sink)
	if err != nil {
		return fmt.Errorf("tracing: %w", err)
	}
	fmt.Println(traced)

	fmt.Println("\nper-worker counts (served by the mock / dispatched by the router / in flight now), weight:")
	var total int64
	for i, m := range mocks {
		w, _ := r.Registry.Get(cfg.Workers[i].ID)
		source := "from telemetry"
		if src, _ := r.Weights().Origin(w.ID()); src.Static {
			source = "static capacity: " + src.Reason
		}
		fmt.Printf("  worker %d (%s): %d / %d / %d, weight %.3g (%s)\n", w.ID(), w.Spec().Device,
			m.Served(), w.Served(), w.Occupancy(), w.Weight(), source)
		if st := w.Engine(); st != nil {
			fmt.Printf("    engine (%s metrics): %g running, %g waiting, KV %.0f%%, batch size %g, %.0f tokens/s a request\n",
				st.Dialect, st.Running, st.Waiting, 100*st.KVUsage, st.Slots, st.TokenRate)
		}
		total += m.Served()
		if w.Occupancy() != 0 {
			return fmt.Errorf("worker %d still holds %d reservations", w.ID(), w.Occupancy())
		}
	}
	// The embeddings', the realtime session's, then demoTrace's.
	if want := int64(*requests + 1 + 1 + stickyRequests + 2*awayRequests + conversationTurns + aliasRequests + 1); total != want {
		return fmt.Errorf("workers served %d requests, want %d", total, want)
	}
	resp, err := client.Get("http://" + r.AdminAddr() + "/metrics")
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	fmt.Println("\nfrom admin /metrics:")
	sc := bufio.NewScanner(resp.Body)
	values := map[string]float64{} // samples read from /metrics
	for sc.Scan() {
		l := sc.Text()
		for _, name := range []string{"fastroute_time_to_first_token_seconds", "fastroute_time_per_output_token_seconds"} {
			for _, part := range []string{"_sum", "_count"} {
				if v, ok := strings.CutPrefix(l, name+part+`{model="mock-model"} `); ok {
					values[name+part], _ = strconv.ParseFloat(v, 64)
				}
			}
		}
		if v, ok := strings.CutPrefix(l, `fastroute_model_requests_total{model="mock-model",outcome="ok"} `); ok {
			values["model_requests"], _ = strconv.ParseFloat(v, 64)
		}
		if strings.HasPrefix(l, "fastroute_worker_inflight") || strings.HasPrefix(l, "fastroute_worker_first_byte_seconds_count") ||
			strings.HasPrefix(l, "fastroute_model_requests_total") ||
			strings.HasPrefix(l, "fastroute_prefix_requests_total") ||
			((strings.HasPrefix(l, "fastroute_requests_total") || strings.HasPrefix(l, "fastroute_worker_answers_total")) &&
				!strings.HasSuffix(l, " 0")) {
			fmt.Println("  " + l)
		}
	}
	ttft, tpot := "fastroute_time_to_first_token_seconds", "fastroute_time_per_output_token_seconds"
	if values["model_requests"] == 0 {
		return fmt.Errorf("no request was counted under mock-model")
	}
	if values[ttft+"_count"] == 0 || values[tpot+"_count"] == 0 {
		return fmt.Errorf("mock-model's streams were not timed: %v", values)
	}
	fmt.Printf("  mock-model's streams: time to first token %.1f ms, time per output token %.1f ms (means over %.0f and %.0f)\n",
		1000*values[ttft+"_sum"]/values[ttft+"_count"], 1000*values[tpot+"_sum"]/values[tpot+"_count"], values[ttft+"_count"], values[tpot+"_count"])
	fmt.Println("\ndemo ok")
	return nil
}

// aliasRequests is how many requests demoAlias sends.
const aliasRequests = 8

// demoAlias asks for the alias "assistant" (demo.yaml) aliasRequests
// times and shows where they went: each answer names the model its engine
// got, one of the alias's targets.
func demoAlias(client *http.Client, base string) (string, error) {
	got := map[string]int{}
	for range aliasRequests {
		resp, err := client.Post(base+"/v1/completions", "application/json", strings.NewReader(`{"model":"assistant","prompt":"hi"}`))
		if err != nil {
			return "", err
		}
		var answer struct{ Model string }
		err = json.NewDecoder(resp.Body).Decode(&answer)
		resp.Body.Close()
		if err != nil || resp.StatusCode != http.StatusOK {
			return "", fmt.Errorf("status %d: %v", resp.StatusCode, err)
		}
		if answer.Model != "mock-model" && answer.Model != "sql-lora" {
			return "", fmt.Errorf("the engine got model %q, no target of the alias", answer.Model)
		}
		got[answer.Model]++
	}
	return fmt.Sprintf("alias assistant (mock-model 3, sql-lora 1): %d requests -> mock-model %d, sql-lora %d (the engines got the target as the model)",
		aliasRequests, got["mock-model"], got["sql-lora"]), nil
}

func demoRequest(client *http.Client, base string, n int, stream bool) (string, error) {
	body := fmt.Sprintf(`{"model":"mock-model","messages":[{"role":"user","content":"hello %d"}],"stream":%v}`, n, stream)
	start := time.Now()
	resp, err := client.Post(base+"/v1/chat/completions", "application/json", strings.NewReader(body))
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		return "", fmt.Errorf("status %d: %s", resp.StatusCode, b)
	}
	worker := resp.Header.Get("x-fastroute-worker")
	if !stream {
		if _, err := io.Copy(io.Discard, resp.Body); err != nil {
			return "", err
		}
		return fmt.Sprintf("request %d  chat          -> worker %s  %v", n, worker, time.Since(start).Round(time.Millisecond)), nil
	}
	chunks, first := 0, time.Duration(0)
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if l := sc.Text(); strings.HasPrefix(l, "data: ") && l != "data: [DONE]" {
			if chunks == 0 {
				first = time.Since(start)
			}
			chunks++
		}
	}
	if err := sc.Err(); err != nil {
		return "", err
	}
	return fmt.Sprintf("request %d  chat, stream  -> worker %s  %d SSE chunks, first after %v, all after %v",
		n, worker, chunks, first.Round(time.Millisecond), time.Since(start).Round(time.Millisecond)), nil
}

func demoEmbedding(client *http.Client, base string) (string, error) {
	resp, err := client.Post(base+"/v1/embeddings", "application/json",
		strings.NewReader(`{"model":"mock-model","input":["fast","route"]}`))
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	var out struct {
		Data []json.RawMessage `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil || resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("embeddings: status %d, %v", resp.StatusCode, err)
	}
	return fmt.Sprintf("embeddings          -> worker %s  %d vectors", resp.Header.Get("x-fastroute-worker"), len(out.Data)), nil
}

func demoQuery(client *http.Client, base string) (string, error) {
	req, _ := http.NewRequest(http.MethodPost, base+"/v1/chat/completions", strings.NewReader(`{"model":"mock-model"}`))
	req.Header.Set("x-query-instance-id", "true")
	resp, err := client.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return "query only          -> " + strings.TrimSpace(string(b)) + "  (not dispatched)", nil
}

// demoRealtime opens a realtime transcription session (vLLM's WebSocket
// API, which the mock plays) through the router at addr, sends three
// pieces of audio and commits them.
func demoRealtime(addr string) (string, error) {
	ws, err := websocket.Dial("ws://"+addr+"/v1/realtime?model=mock-model", "", "http://localhost/")
	if err != nil {
		return "", err
	}
	defer ws.Close()
	if err := ws.SetDeadline(time.Now().Add(10 * time.Second)); err != nil {
		return "", err
	}
	var created struct {
		Worker uint64 `json:"worker"`
	}
	if err := websocket.JSON.Receive(ws, &created); err != nil {
		return "", err
	}
	audio := base64.StdEncoding.EncodeToString(make([]byte, 3200)) // 100 ms of 16 kHz PCM16 silence
	var text strings.Builder
	for range 3 {
		if err := websocket.JSON.Send(ws, map[string]string{"type": "input_audio_buffer.append", "audio": audio}); err != nil {
			return "", err
		}
		var delta struct {
			Delta string `json:"delta"`
		}
		if err := websocket.JSON.Receive(ws, &delta); err != nil {
			return "", err
		}
		text.WriteString(delta.Delta)
	}
	if err := websocket.JSON.Send(ws, map[string]any{"type": "input_audio_buffer.commit", "final": true}); err != nil {
		return "", err
	}
	var done struct {
		Type string `json:"type"`
	}
	if err := websocket.JSON.Receive(ws, &done); err != nil || done.Type != "transcription.done" {
		return "", fmt.Errorf("no transcription.done (%q, %v)", done.Type, err)
	}
	return fmt.Sprintf("realtime session    -> worker %d  %q, then %s (WebSocket, relayed both ways)",
		created.Worker, strings.TrimSpace(text.String()), done.Type), nil
}

// demoDisagg runs a second router in front of a prefill and a decode
// engine (vLLM's KV-connector protocol) and sends one streaming request
// through it.
func demoDisagg(client *http.Client) (string, error) {
	cfg := config.Default()
	cfg.Listen, cfg.AdminListen = "127.0.0.1:0", "127.0.0.1:0"
	cfg.Router.Disaggregation.Protocol = config.DisaggVLLM
	engine := mockworker.EngineOptions{MaxNumSeqs: 8, InterTokenLatency: 15 * time.Millisecond, PrefillPerToken: 200 * time.Microsecond}
	for id, role := range []dataplane.Role{dataplane.RolePrefill, dataplane.RoleDecode} {
		m, err := mockworker.Start("127.0.0.1:0", mockworker.Options{ID: uint64(id + 11), Tokens: 6, Engine: engine})
		if err != nil {
			return "", err
		}
		defer m.Close()
		cfg.Workers = append(cfg.Workers, dataplane.WorkerSpec{ID: uint64(id + 11), URL: m.URL(), Role: role})
	}
	r, err := router.Start(cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		return "", err
	}
	defer r.Close()
	line, err := demoRequest(client, "http://"+r.Addr(), 1, true)
	if err != nil {
		return "", err
	}
	m := r.Frontend.Metrics()
	if m.Phase("prefill", "ok") != 1 || m.Phase("decode", "ok") != 1 {
		return "", fmt.Errorf("prefill legs ok %d, decode legs ok %d; want 1 and 1", m.Phase("prefill", "ok"), m.Phase("decode", "ok"))
	}
	return strings.Replace(line, "request 1  chat, stream  -> worker", "disaggregated (vllm-nixl): prefill on worker 11, decode on worker", 1), nil
}

// demoKeys runs a second router that checks clients' API keys (a keys
// file with a token cap) in front of one engine, and sends a request
// without a key, then requests with one until the key's tokens per minute
// run out.
func demoKeys(client *http.Client) (string, error) {
	dir, err := os.MkdirTemp("", "fastroute-demo-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(dir)
	const key = "sk-demo-app-7c1e4b9a2f"
	cfg := config.Default()
	cfg.Listen, cfg.AdminListen = "127.0.0.1:0", "127.0.0.1:0"
	cfg.APIKeysFile = filepath.Join(dir, "keys")
	if err := os.WriteFile(cfg.APIKeysFile, []byte("demo-app "+key+" max_inflight=4 tokens_per_minute=40\n"), 0o600); err != nil {
		return "", err
	}
	m, err := mockworker.Start("127.0.0.1:0", mockworker.Options{ID: 21, Tokens: 6})
	if err != nil {
		return "", err
	}
	defer m.Close()
	cfg.Workers = []dataplane.WorkerSpec{{ID: 21, URL: m.URL()}}
	r, err := router.Start(cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		return "", err
	}
	defer r.Close()
	send := func(header string) (int, string, error) {
		req, _ := http.NewRequest(http.MethodPost, "http://"+r.Addr()+"/v1/chat/completions",
			strings.NewReader(`{"model":"mock-model","messages":[{"role":"user","content":"hello"}]}`))
		if header != "" {
			req.Header.Set("Authorization", header)
		}
		resp, err := client.Do(req)
		if err != nil {
			return 0, "", err
		}
		defer resp.Body.Close()
		_, err = io.Copy(io.Discard, resp.Body)
		return resp.StatusCode, resp.Header.Get("Retry-After"), err
	}
	code, _, err := send("")
	if err != nil || code != http.StatusUnauthorized {
		return "", fmt.Errorf("without a key: status %d, %v; want 401", code, err)
	}
	var codes []string
	for range 10 {
		code, retry, err := send("Bearer " + key)
		if err != nil {
			return "", err
		}
		codes = append(codes, strconv.Itoa(code))
		if code == http.StatusTooManyRequests {
			c := r.APIKeys.Clients()[0]
			prompt, completion := c.Tokens()
			return fmt.Sprintf("api keys            -> no key: 401; key demo-app: %s (%d prompt + %d completion tokens charged, "+
				"tokens_per_minute 40, retry after %s s)", strings.Join(codes, ", "), prompt, completion, retry), nil
		}
		if code != http.StatusOK {
			return "", fmt.Errorf("with the key: status %d", code)
		}
	}
	return "", fmt.Errorf("the key's tokens per minute never ran out: %s", strings.Join(codes, ", "))
}

// conversationTurns is how many requests demoConversation sends.
const conversationTurns = 3

// demoConversation sends the turns of one conversation, each with the
// conversation so far, turn i through router bases[i mod len(bases)]
// (then settle, when not nil), and reports the workers they went to
// (prefix affinity keeps them on one) and the prompt tokens its engines
// found in their prefix caches.
func demoConversation(client *http.Client, bases []string, settle func() error, mocks []*mockworker.Worker) (string, error) {
	// A system prompt longer than a prefix block (256 bytes), so that even
	// the first turn is keyed.
	history := `{"role":"system","content":"You are a travel agent for people who like to walk. Answer with one short suggestion: a region, ` +
		`the best season to go there, a trail of a few days that starts and ends near public transport, and the kind of lodging ` +
		`found along it. Keep to places with marked paths, and say how fit one must be."},{"role":"user","content":"Where should I go for a week of hiking?"}`
	var went []string
	for turn := range conversationTurns {
		w, err := demoSend(client, bases[turn%len(bases)]+"/v1/chat/completions", `{"model":"mock-model","messages":[`+history+`]}`, "")
		if err == nil && settle != nil {
			err = settle()
		}
		if err != nil {
			return "", err
		}
		went = append(went, w)
		history += fmt.Sprintf(`,{"role":"assistant","content":"Suggestion %d."},{"role":"user","content":"Somewhere else, please?"}`, turn+1)
	}
	for _, w := range went[1:] {
		if w != went[0] { // nothing else runs: no worker is busier than the slack allows
			return "", fmt.Errorf("turns went to workers %s, not all to the first turn's", strings.Join(went, ", "))
		}
	}
	hits := 0.0
	for _, m := range mocks {
		hits += m.PrefixCacheHits()
	}
	return fmt.Sprintf("conversation         -> workers %s (prefix affinity; %.0f prompt tokens found in the engines' prefix caches)",
		strings.Join(went, ", "), hits), nil
}

// stickyRequests is how many requests demoSticky sends.
const stickyRequests = 4

// demoSticky sends a LoRA request (only worker 3 holds sql-lora) and three
// requests of one session (soft affinity keeps them on one worker).
func demoSticky(client *http.Client, base string) (string, error) {
	url := base + "/v1/completions"
	loraWorker, err := demoSend(client, url, `{"model":"sql-lora","prompt":"select"}`, "")
	if err != nil {
		return "", err
	}
	var session []string
	for i := 0; i < stickyRequests-1; i++ {
		w, err := demoSend(client, url, `{"model":"mock-model","prompt":"hi"}`, "demo-session")
		if err != nil {
			return "", err
		}
		session = append(session, w)
	}
	return fmt.Sprintf("lora sql-lora       -> worker %s\nsession demo-session -> workers %s (soft affinity)",
		loraWorker, strings.Join(session, ", ")), nil
}

// awayRequests are the requests demoSleep and demoDown send while a worker
// is out of rotation.
const awayRequests = 4

// demoSleep puts the engine of worker (served by m) to sleep as an RL
// trainer does (vLLM's POST /sleep), waits for the router to read it in the
// engine's metrics, sends awayRequests requests, which go to the other
// workers, and wakes the engine up again.
func demoSleep(client *http.Client, base string, reg *dataplane.Registry, worker uint64, m *mockworker.Worker) (string, error) {
	engine := func(path string, asleep bool) func() error { // and wait for the router to see it so
		return func() error {
			resp, err := client.Post(m.URL()+path, "", nil)
			if err != nil {
				return err
			}
			_ = resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				return fmt.Errorf("%s: status %d", path, resp.StatusCode)
			}
			for deadline := time.Now().Add(2 * time.Second); ; time.Sleep(10 * time.Millisecond) {
				// Seen: its flag, and out of (or back in) the routable
				// snapshot the registry publishes just after the flag.
				if w, ok := reg.Get(worker); ok && w.Asleep() == asleep && reg.Snapshot().Has(worker) != asleep {
					return nil
				}
				if time.Now().After(deadline) {
					return fmt.Errorf("after %s, the router did not see worker %d's engine's sleep state change within 2s", path, worker)
				}
			}
		}
	}
	went, err := demoAway(client, base, worker, engine("/sleep?level=1", true), engine("/wake_up", false))
	return fmt.Sprintf("worker %d asleep      -> workers %s (vLLM's sleep mode, read in its metrics; woken up after)", worker, went), err
}

// demoDown puts worker down by hand through the admin API (PATCH
// /workers/{id}, an engine's maintenance), sends awayRequests requests,
// which go to the other workers, and puts it back.
func demoDown(client *http.Client, base, admin string, worker uint64) (string, error) {
	patch := func(body string) func() error { return func() error { return demoPatch(client, admin, worker, body) } }
	went, err := demoAway(client, base, worker, patch(`{"down":true}`), patch(`{"down":false}`))
	return fmt.Sprintf("worker %d down        -> workers %s (PATCH /workers/%d {\"down\":true} on the admin API; put back after)", worker, went, worker), err
}

// demoPatch sends PATCH /workers/{worker} with body to the admin API at
// admin; an answer other than 200 is an error carrying its body.
func demoPatch(client *http.Client, admin string, worker uint64, body string) error {
	req, _ := http.NewRequest(http.MethodPatch, fmt.Sprintf("http://%s/workers/%d", admin, worker), strings.NewReader(body))
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	answer, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("PATCH %s: status %d: %s", body, resp.StatusCode, answer)
	}
	return nil
}

// demoAway takes worker out of rotation with away, sends awayRequests
// requests, which must all go to the others, puts it back with back, and
// lists where they went.
func demoAway(client *http.Client, base string, worker uint64, away, back func() error) (string, error) {
	if err := away(); err != nil {
		return "", err
	}
	id := strconv.FormatUint(worker, 10)
	var went []string
	for range awayRequests {
		w, err := demoSend(client, base+"/v1/completions", `{"model":"mock-model","prompt":"hi"}`, "")
		if err != nil {
			return "", err
		}
		if w == id {
			return "", fmt.Errorf("a request went to worker %s, out of rotation", id)
		}
		went = append(went, w)
	}
	return strings.Join(went, ", "), back()
}

// demoSend posts body to url (with the session header when session is
// set) and returns the worker that answered; an answer other than 200 is
// an error carrying its body.
func demoSend(client *http.Client, url, body, session string) (string, error) {
	req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	if session != "" {
		req.Header.Set("x-session-id", session)
	}
	resp, err := client.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("status %d: %s", resp.StatusCode, b)
	}
	return resp.Header.Get("x-fastroute-worker"), nil
}
