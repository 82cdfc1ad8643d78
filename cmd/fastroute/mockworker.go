package main

import (
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"

	"github.com/fastroute/fastroute/bench/mockworker"
	"github.com/fastroute/fastroute/dataplane"
	"github.com/fastroute/fastroute/discovery"
	"github.com/fastroute/fastroute/internal/tlsfiles"
)

func runMockWorker(args []string) error {
	fs := flag.NewFlagSet("mockworker", flag.ContinueOnError)
	listen := fs.String("listen", "127.0.0.1:9001", "listen address")
	uds := fs.String("uds", "", "listen on this unix socket instead of --listen, as vLLM's --uds")
	var o mockworker.Options
	fs.Uint64Var(&o.ID, "id", 1, "worker id (echoed in answers)")
	fs.IntVar(&o.Tokens, "tokens", 8, "chunks per answer")
	fs.DurationVar(&o.TokenInterval, "token-interval", 0, "pause before each chunk")
	fs.StringVar(&o.Model, "model", "mock-model", "model name")
	fs.StringVar(&o.APIKey, "api-key", "", "answer /v1/ routes only with Authorization: Bearer <key>, as vLLM's --api-key")
	loras := fs.String("loras", "", "comma-separated LoRA adapters to advertise")
	fs.Float64Var(&o.FailRate, "fail-rate", 0, "share of requests answered 500")
	fs.IntVar(&o.MaxModelLen, "max-model-len", 0, "context length in tokens, as vLLM's --max-model-len: /v1/models reports it, and a request whose prompt (4 bytes of body a token) and max_tokens exceed it is answered vLLM's 400 (0: /v1/models reports 8192, nothing refused)")
	fs.BoolVar(&o.ResponsesStore, "responses-store", false, "store the Responses API's responses for GET /v1/responses/{id} and previous_response_id, as vLLM with VLLM_ENABLE_RESPONSES_API_STORE=1")
	e := &o.Engine
	fs.IntVar(&e.MaxNumSeqs, "max-num-seqs", 0, "simulate an engine with this many running slots and a waiting queue (0: fixed-time answers)")
	fs.DurationVar(&e.InterTokenLatency, "inter-token-latency", mockworker.DefaultInterTokenLatency, "engine: decode step at a batch of one")
	fs.Float64Var(&e.LoadFactor, "load-factor", mockworker.DefaultLoadFactor, "engine: extra step time per further running request, as a share of --inter-token-latency")
	fs.DurationVar(&e.PrefillPerToken, "prefill-per-token", mockworker.DefaultPrefillPerToken, "engine: prefill time per prompt token (4 bytes of body a token)")
	fs.Float64Var(&e.Speed, "speed", 1, "engine: divides every duration (a CPU-like engine: 0.1667)")
	fs.BoolVar(&e.PrefixCache, "prefix-cache", false, "engine: keep prompts' blocks cached (vLLM's prefix caching): a prompt prefills only what follows its longest cached prefix")
	fs.IntVar(&e.KVBlocks, "kv-blocks", mockworker.DefaultKVBlocks, "engine: KV cache blocks")
	fs.IntVar(&e.BlockSize, "block-size", mockworker.DefaultBlockSize, "engine: tokens per KV cache block")
	fs.IntVar(&e.MaxLoRA, "max-lora", mockworker.DefaultMaxLoRA, "engine: adapters per batch (reported in vllm:lora_requests_info)")
	fs.DurationVar(&o.MetricsDelay, "metrics-delay", 0, "answer /metrics this long after it is asked, as a busy engine's API server does")
	fs.BoolVar(&o.NoMetrics, "no-metrics", false, "answer /metrics 404, as SGLang without --enable-metrics and Ollama do")
	fs.StringVar(&o.MetricsDialect, "metrics-dialect", "vllm", "names of the /metrics series: vllm, sglang, trtllm (TensorRT-LLM's trtllm-serve), tgi (text-generation-inference) or llamacpp (llama.cpp's llama-server)")
	certFile := fs.String("ssl-certfile", "", "PEM certificate chain: clients speak TLS to the worker (with --ssl-keyfile), as vLLM's --ssl-certfile")
	keyFile := fs.String("ssl-keyfile", "", "PEM private key of --ssl-certfile")
	caFile := fs.String("ssl-ca-certs", "", "PEM CA certificates: clients must show a certificate they signed (mutual TLS, as vLLM with --ssl-ca-certs and --ssl-cert-reqs 2)")
	etcd := bindEtcdFlags(fs, "etcd-")
	if err := fs.Parse(args); err != nil {
		return err
	}
	var err error
	if o.TLS, err = mockTLS(*certFile, *keyFile, *caFile); err != nil {
		return err
	}
	if *loras != "" {
		o.LoRAs = strings.Split(*loras, ",")
	}
	if o.FailRate < 0 || o.FailRate > 1 {
		return fmt.Errorf("--fail-rate %v is outside 0..1", o.FailRate)
	}
	if !slices.Contains(mockworker.MetricsDialects, o.MetricsDialect) {
		return fmt.Errorf("--metrics-dialect %q is not one of %s", o.MetricsDialect, strings.Join(mockworker.MetricsDialects, ", "))
	}
	if !(e.Speed > 0) || e.LoadFactor < 0 || e.MaxNumSeqs < 0 {
		return fmt.Errorf("--speed must be positive, --load-factor and --max-num-seqs not negative")
	}
	network, addr := "tcp", *listen
	if *uds != "" {
		network, addr = "unix", *uds
	}
	ln, err := net.Listen(network, addr)
	if err != nil {
		return err
	}
	w := mockworker.Serve(ln, o)
	fmt.Fprintf(os.Stderr, "mockworker %d listening on %s\n", o.ID, w.Addr())
	var reg *discovery.Registration
	if etcd.endpoints != "" {
		if reg, err = etcd.register(dataplane.WorkerSpec{ID: o.ID, URL: w.URL(), LoRAs: o.LoRAs, MaxInflight: e.MaxNumSeqs}); err != nil {
			_ = w.Close()
			return err
		}
		fmt.Fprintf(os.Stderr, "mockworker %d registered as %s\n", o.ID, reg.Key())
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	<-sig
	if reg != nil {
		err = reg.Close()
	}
	return errors.Join(err, w.Close())
}

// mockTLS is a mock worker's TLS configuration from its flags' files (nil
// with none).
func mockTLS(certFile, keyFile, caFile string) (*tls.Config, error) {
	if certFile == "" && keyFile == "" && caFile == "" {
		return nil, nil
	}
	if certFile == "" || keyFile == "" {
		return nil, errors.New("--ssl-certfile and --ssl-keyfile go together")
	}
	cert, err := tlsfiles.Pair("--ssl-certfile", certFile, keyFile)
	if err != nil {
		return nil, err
	}
	conf := &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{*cert}}
	if caFile != "" {
		if conf.ClientCAs, err = tlsfiles.Roots("--ssl-ca-certs", caFile); err != nil {
			return nil, err
		}
		conf.ClientAuth = tls.RequireAndVerifyClientCert
	}
	return conf, nil
}
