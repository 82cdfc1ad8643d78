package fuzz

import (
	"strings"
	"testing"

	"github.com/fastroute/fastroute/dataplane/config"
)

// FuzzConfigFile: any config text either fails with an error naming the
// file, or gives a config that passes Validate again and whose redacted
// YAML (GET /config) parses back into the same config but for its
// secrets, which it does not show. Never a panic.
func FuzzConfigFile(f *testing.F) {
	f.Add("listen: 127.0.0.1:8000\nadmin_listen: 127.0.0.1:9090\nadmin_token: s3cret-admin-token\nrouter: {mode: least-loaded, retries: 2}\n" +
		"workers:\n  - {id: 1, url: \"http://127.0.0.1:9001\", device: gpu, gpu_index: 0, loras: [sql-lora]}\n  - {id: 2, url: \"http://127.0.0.1:9002\", device: cpu, capacity: 0.25}\n")
	f.Add("router:\n  mode: device-aware-weighted\n  prefix_affinity: {enabled: true}\nmodel_aliases:\n  - {name: assistant, targets: [{model: m, weight: 3}, {model: sql-lora, weight: 1}]}\n" +
		"health: {interval: 500ms, path: /health, unhealthy_after: 3}\ntelemetry: {nvml: true, cpu: true, interval: 100ms}\n")
	f.Add("limits: {max_body_bytes: 16MiB, max_header_bytes: 128KiB, answer_buffer_bytes: 4MiB, first_byte_timeout: 30s}\nworker_api_key: sk-engine-key-1234\n" +
		"discovery: {etcd: {endpoints: [\"http://127.0.0.1:2379\"], username: root, password: etcd-pass-123}}\n")
	f.Add("tracing: {otlp_endpoint: \"http://user:otlp-pass-99@127.0.0.1:4318\", headers: {authorization: Bearer-abc}}\ncors_allowed_origins: ['*']\n")
	f.Add("workers: [{id: 1, url: 'http://engine:s3cret@10.0.0.1:8000'}]")
	f.Add("router: {disaggregation: {protocol: vllm-nixl, min_prefill_tokens: 16, max_prefill_queue: 2}}\nworkers: [{id: 1, url: 'http://a:1', role: prefill}, {id: 2, url: 'http://b:2', role: decode}]\n")
	f.Add("&a [*a]")
	f.Fuzz(func(t *testing.T, text string) {
		cfg, err := config.Parse("f.yaml", []byte(text))
		if err != nil {
			if !strings.HasPrefix(err.Error(), "config f.yaml: ") {
				t.Fatalf("error %q does not name the file", err)
			}
			return
		}
		if err := cfg.Validate(); err != nil {
			t.Fatalf("a parsed config fails Validate: %v", err)
		}
		shown, err := cfg.RedactedYAML()
		if err != nil {
			t.Fatalf("RedactedYAML: %v", err)
		}
		back, err := config.Parse("shown.yaml", shown)
		if err != nil {
			t.Fatalf("the redacted YAML does not parse back: %v\n%s", err, shown)
		}
		again, err := back.RedactedYAML()
		if err != nil || string(again) != string(shown) {
			t.Fatalf("the redacted YAML changed on its way back (%v):\n%s\n---\n%s", err, shown, again)
		}
	})
}
