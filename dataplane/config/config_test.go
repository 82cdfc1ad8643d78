package config

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/fastroute/fastroute/dataplane"
	"github.com/fastroute/fastroute/pickers"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const designExample = `
listen: 127.0.0.1:8000
admin_listen: 127.0.0.1:9090
admin_token: ""
router:
  mode: device-aware-weighted
  busy_threshold: 64
  retries: 2
  session_affinity: {mode: soft, header: x-session-id, ttl: 10m}
telemetry: {nvml: true, cpu: true, interval: 250ms}
health: {interval: 2s, path: /health, unhealthy_after: 3}
workers:
  - {id: 1, url: "http://127.0.0.1:9001", device: gpu, gpu_index: 0, dp_size: 1, loras: [sql-lora], models: [llama]}
  - {id: 2, url: "http://127.0.0.1:9002", device: cpu, capacity: 0.25}
`

func TestLoadDesignExample(t *testing.T) {
	path := filepath.Join(t.TempDir(), "fastroute.yaml")
	require.NoError(t, os.WriteFile(path, []byte(designExample), 0o600))
	cfg, err := Load(path)
	require.NoError(t, err)
	assert.Equal(t, pickers.ModeWeighted, cfg.Router.Mode)
	assert.Equal(t, 250*time.Millisecond, cfg.Telemetry.Interval)
	assert.Equal(t, 10*time.Minute, cfg.Router.SessionAffinity.TTL)
	require.Len(t, cfg.Workers, 2)
	assert.Equal(t, dataplane.DeviceGPU, cfg.Workers[0].Device)
	assert.Equal(t, []string{"sql-lora"}, cfg.Workers[0].LoRAs)
	assert.Equal(t, []string{"llama"}, cfg.Workers[0].Models)
	assert.Equal(t, 1.0, cfg.Workers[0].Capacity, "capacity defaults to 1")
	assert.Equal(t, 0.25, cfg.Workers[1].Capacity)
	assert.Equal(t, Size(16<<20), cfg.Limits.MaxBodyBytes, "body limit defaults to 16 MiB")
}

func TestEmptyFileKeepsDefaults(t *testing.T) {
	cfg, err := Parse("empty.yaml", nil)
	require.NoError(t, err)
	assert.Equal(t, Default().Listen, cfg.Listen)
}

func TestBadConfigNamesFileKeyAndReason(t *testing.T) {
	for _, c := range []struct{ yaml, want string }{
		{"router: {mode: fastest}", `config f.yaml: key router.mode: unknown mode "fastest"`},
		{"router: {busy_threshold: -1}", "key router.busy_threshold: -1 is negative"},
		{"router: {retries: 99}", "key router.retries: 99 is outside 0..7"},
		{"router: {queue: {size: -1}}", "key router.queue.size: -1 is negative"},
		{"health: {timeout: -1s}", "key health.timeout: -1s is negative (0: health.interval)"},
		{"router: {disaggregation: {protocol: sglang-bootstrap, max_prefill_queue: 2}}", "key router.disaggregation.max_prefill_queue: does not apply to sglang-bootstrap"},
		{"router: {disaggregation: {protocol: vllm-nixl, max_prefill_queue: 2}}\ntelemetry: {engine: {enabled: false}}", "key router.disaggregation.max_prefill_queue: needs telemetry.engine.enabled"},
		{"telemetry: {engine: {enabled: false, stall_after: 2m}}", "key telemetry.engine.stall_after: needs telemetry.engine.enabled"},
		{"router: {disaggregation: {protocol: vllm-nixl, max_prefill_queue: -1}}", "key router.disaggregation.max_prefill_queue: -1 is negative"},
		{"router: {prefix_affinity: {enabled: true, block_bytes: 8}}", "key router.prefix_affinity.block_bytes: 8 is outside 16..65536"},
		{"router: {prefix_affinity: {table_size: 0}}", "key router.prefix_affinity.table_size: 0 is outside 64..67108864"},
		{"router: {prefix_affinity: {max_blocks: 0}}", "key router.prefix_affinity.max_blocks: 0 is outside 1..4096"},
		{"router: {prefix_affinity: {slack: -1}}", "key router.prefix_affinity.slack: -1 is negative"},
		{"router: {prefix_affinity: {share_interval: 0s}}", "key router.prefix_affinity.share_interval: 0s is outside 1ms..10s"},
		{"router: {prefix_affinity: {peers: ['10.0.0.2:8001']}}", `key router.prefix_affinity.peers: "10.0.0.2:8001" is not a replica's admin listener as http(s)://host:port`},
		{"router: {prefix_affinity: {peers: ['http://u:p@10.0.0.2:8001']}}", "is not a replica's admin listener"},
		{"router: {prefix_affinity: {peers: ['http://10.0.0.2:8001/x']}}", "is not a replica's admin listener"},
		{"router: {prefix_affinity: {peers: ['*']}}", "is not a replica's admin listener"},
		{"router: {prefix_affinity: {advertise: 'http://10.0.0.2:8001'}}", "key router.prefix_affinity.advertise: needs discovery.etcd.endpoints, where replicas find each other"},
		{"{router: {prefix_affinity: {advertise: '10.0.0.2'}}, discovery: {etcd: {endpoints: ['127.0.0.1:2379']}}}", `key router.prefix_affinity.advertise: "10.0.0.2" is not this replica's admin listener as http(s)://host:port`},
		{"{router: {prefix_affinity: {advertise: 'http://10.0.0.2:8001'}}, discovery: {etcd: {endpoints: ['127.0.0.1:2379']}}, admin_tls: {cert_file: a.pem, key_file: a.key}}",
			`key router.prefix_affinity.advertise: "http://10.0.0.2:8001" does not say what the admin listener speaks: https:// with admin_tls set, http:// without`},
		{"{router: {prefix_affinity: {advertise: 'https://10.0.0.2:8001'}}, discovery: {etcd: {endpoints: ['127.0.0.1:2379']}}}",
			`key router.prefix_affinity.advertise: "https://10.0.0.2:8001" does not say what the admin listener speaks`},
		{"admin_tls: {key_file: a.key}", "key admin_tls: set cert_file and key_file together"},
		{"forwarded_client_cert: {from: [sidecar]}", `key forwarded_client_cert.from: "sidecar" is neither an IP nor a CIDR prefix`},
		{"tls: {cert_file: c.pem, key_file: k.pem, client_crl_file: crl.pem}", "key tls.client_crl_file: set, but tls.client_ca_file is not"},
		{"tls: {cert_file: c.pem}", "key tls: set cert_file and key_file together"},
		{"worker_tls: {key_file: k.pem}", "key worker_tls: set cert_file and key_file together"},
		{"discovery: {dns: {names: [vllm-headless]}}", `key discovery.dns: names[0]: "vllm-headless" is not host:port`},
		{"discovery: {dns: {names: ['vllm:8000'], scheme: grpc}}", `key discovery.dns: scheme: "grpc" is not http or https`},
		{"discovery: {dns: {names: ['vllm:8000'], family: ipv6_only}}", `key discovery.dns: family: "ipv6_only" is not prefer_ipv4, prefer_ipv6 or both`},
		{"discovery: {dns: {names: ['vllm:8000'], worker: {url: 'http://x:1'}}}", "key discovery.dns: worker: id and url are each address's"},
		{"discovery: {dns: {names: ['vllm:8000'], worker: {role: router}}}", `key discovery.dns: worker.role: "router"`},
		{"worker_tls: {insecure_skip_verify: true, ca_file: ca.pem}", "key worker_tls.insecure_skip_verify: checks no certificate, so ca_file and server_name would do nothing"},
		{"workers: [{id: 1, url: 'ftp://10.0.0.1:8000'}]", `url: "ftp://10.0.0.1:8000" is not an http://host:port, https://host:port or unix:/path address`},
		{"workers: [{id: 1, url: 'https://10.0.0.1:8000/v1'}]", `has more than https://host:port`},
		{"router: {retry_statuses: [503, 404]}", "key router.retry_statuses: 404 is not 408, 429 or 5xx"},
		{"router: {queue: {size: 8, timeout: 0s}}", "key router.queue.timeout: 0s must be positive"},
		{"shutdown_delay: -1s", "key shutdown_delay: -1s is negative"},
		{"router: {session_affinity: {mode: sticky}}", "key router.session_affinity.mode"},
		{"telemetry: {interval: 0s}", "key telemetry.interval"},
		{"telemetry: {engine: {stall_after: -1s}}", "key telemetry.engine.stall_after: -1s is negative (0: never)"},
		{"health: {path: health}", "key health.path"},
		{"listen: nowhere", `key listen: "nowhere" is not host:port`},
		{"limits: {max_body_bytes: 0}", "key limits.max_body_bytes"},
		{"workers: [{id: 1, url: 'http://a:1'}, {id: 1, url: 'http://b:1'}]", "key workers[1].id: duplicate id 1"},
		{"workers: [{id: 1, url: 'a:1'}]", "key workers[0].url"},
		{"workers: [{id: 1, url: 'http://a:1', device: tpu}]", `key workers[0].device: "tpu" is not gpu or cpu`},
		{"workers: [{id: 1, url: 'http://a:1', models: [llama, '']}]", "key workers[0].models[1]: an empty model name"},
		{"workers: [{id: 1, url: 'http://a:1', loras: [\"sql\\u0000\"]}]", `key workers[0].loras[0]: adapter name "sql\x00" holds a control character`},
		{"workers: [{id: 1, url: 'http://engine:s3cret@10.0.0.1:8000'}]", `url: "http://engine:xxxxx@10.0.0.1:8000" holds credentials, which the router would not send`},
		{"cors_allowed_origins: ['https://app.example/']", `key cors_allowed_origins[0]: "https://app.example/" is not an origin`},
		{"cors_allowed_origins: ['*', 'app.example']", `key cors_allowed_origins[1]: "app.example" is not an origin`},
		{"cors_allowed_origins: ['ftp://a']", `key cors_allowed_origins[0]: "ftp://a" is not an origin`},
		{"model_aliases: [{name: x, targets: [{model: a, weight: 1}, {model: b, weight: -2}]}]", "key model_aliases[0].targets[1].weight: -2 is negative"},
		{"model_aliases: [{name: x, targets: [{model: a}]}, {name: x, targets: [{model: b}]}]", `key model_aliases[1].name: "x" is an alias already`},
		{"model_aliases: [{name: x, targets: [{model: a, wieght: 1}]}]", "field wieght not found"},
		{"router: {retry_budget: {percent: 101}}", "key router.retry_budget.percent: 101 is outside 0..100 (0 turns the budget off)"},
		{"router: {retry_budget: {percent: 20, min_retries: -1}}", "key router.retry_budget.min_retries: -1 is negative"},
		{"model_aliases: [{name: x, targets: [{model: a}]}]\nmodel_mirrors: [{model: x, to: b, percent: 5}]", `key model_mirrors[0].model: "x" is a model alias`},
		{"tracing: {otlp_endpoint: 'collector:4317'}", `key tracing.otlp_endpoint: "collector:4317" is not an http:// or https:// URL with a host`},
		{"tracing: {sample_ratio: 2}", "key tracing.sample_ratio: 2 is not a ratio between 0 and 1"},
		{"tracing: {otlp_endpoint: 'http://c:4318', service_name: ''}", "key tracing.service_name: is empty"},
		{"model_mirrors: [{model: a, to: b, percent: 120}]", "key model_mirrors[0].percent: 120 is not above 0 and at most 100"},
		{"model_mirrors: [{model: a, to: b, percent: 5}, {model: a, to: c, percent: 5}]", `key model_mirrors[1].model: "a" is mirrored already`},
		{"api_keys_share_interval: 1s", "key api_keys_share_interval: needs discovery.etcd.endpoints, where replicas share their keys' use"},
		{"{api_keys_share_interval: 1s, discovery: {etcd: {endpoints: ['127.0.0.1:2379']}}}", "key api_keys_share_interval: needs api_keys_file"},
		{"{api_keys_share_interval: 10ms, api_keys_file: k, discovery: {etcd: {endpoints: ['127.0.0.1:2379']}}}", "key api_keys_share_interval: 10ms is below 100ms"},
		{"api_keys_share_interval: -1s", "key api_keys_share_interval: -1s is negative"},
		{"rooter: {}", "field rooter not found"},
		{"telemetry: {interval: soon}", "config f.yaml: "},
		{"listen: [", "config f.yaml: "},
	} {
		_, err := Parse("f.yaml", []byte(c.yaml))
		require.Error(t, err, c.yaml)
		assert.Contains(t, err.Error(), c.want, c.yaml)
	}
	_, err := Parse("f.yaml", []byte("workers: [{id: 1, url: 'http://engine:s3cret@10.0.0.1:8000'}]"))
	assert.NotContains(t, err.Error(), "s3cret", "a password in a worker URL is never echoed")
	_, err = Load(filepath.Join(t.TempDir(), "missing.yaml"))
	assert.ErrorContains(t, err, "missing.yaml")
	cfg, err := Parse("f.yaml", []byte("cors_allowed_origins: ['https://app.example', 'http://localhost:3000', '*']"))
	require.NoError(t, err)
	assert.Len(t, cfg.CORSAllowedOrigins, 3)
}

func TestSizes(t *testing.T) {
	for in, want := range map[string]Size{"65536": 65536, "64KiB": 64 << 10, "16MiB": 16 << 20, "1 GiB": 1 << 30, "10KB": 10000, "2MB": 2e6, "512B": 512} {
		got, err := ParseSize(in)
		require.NoError(t, err, in)
		assert.Equal(t, want, got, in)
	}
	for _, in := range []string{"", "16XB", "-1", "1.5MiB", "99999999GiB"} {
		_, err := ParseSize(in)
		assert.Error(t, err, in)
	}
	assert.Equal(t, Size(1<<20), Default().Limits.AnswerBufferBytes)
	cfg, err := Parse("f.yaml", []byte("limits: {max_body_bytes: 16MiB, max_header_bytes: 128KiB, answer_buffer_bytes: 4MiB}\n"))
	require.NoError(t, err)
	assert.Equal(t, Size(16<<20), cfg.Limits.MaxBodyBytes)
	assert.Equal(t, Size(128<<10), cfg.Limits.MaxHeaderBytes)
	assert.Equal(t, Size(4<<20), cfg.Limits.AnswerBufferBytes)
	assert.Zero(t, cfg.Limits.MaxConnections, "0: derived from the open-files limit")
	cfg, err = Parse("f.yaml", []byte("limits: {max_connections: 5000}\n"))
	require.NoError(t, err)
	assert.Equal(t, 5000, cfg.Limits.MaxConnections)
	_, err = Parse("f.yaml", []byte("limits: {max_connections: -1}\n"))
	assert.ErrorContains(t, err, "key limits.max_connections: -1 is negative")
	_, err = Parse("f.yaml", []byte("limits: {answer_buffer_bytes: 1KiB}\n"))
	assert.ErrorContains(t, err, "key limits.answer_buffer_bytes: 1024 is under 4KiB")
	_, err = Parse("f.yaml", []byte("limits:\n  max_body_bytes: 16XB\n"))
	assert.ErrorContains(t, err, `config f.yaml: `)
	assert.ErrorContains(t, err, `line 2: "16XB" is not a size`)
	_, err = Parse("f.yaml", []byte("limits: {max_header_bytes: 100}\n"))
	assert.ErrorContains(t, err, "key limits.max_header_bytes: 100 is outside 1KiB..16MiB")
}

func TestWorkerAPIKeyComesFromTheConfigAFileOrTheEnvironment(t *testing.T) {
	file := filepath.Join(t.TempDir(), "key")
	require.NoError(t, os.WriteFile(file, []byte(" k-file \nsecond line\n"), 0o600))
	noEnv := func(string) string { return "" }

	c := Default()
	c.WorkerAPIKeyFile = file
	require.NoError(t, c.ResolveSecrets(noEnv))
	assert.Equal(t, "k-file", c.WorkerAPIKey)

	c = Default()
	require.NoError(t, c.ResolveSecrets(func(k string) string {
		if k == WorkerAPIKeyEnv {
			return " k-env\n"
		}
		return ""
	}))
	assert.Equal(t, "k-env", c.WorkerAPIKey)

	c = Default()
	c.WorkerAPIKey, c.WorkerAPIKeyFile = "k", file
	assert.EqualError(t, c.ResolveSecrets(noEnv), "key worker_api_key_file: set worker_api_key or worker_api_key_file, not both")

	empty := filepath.Join(t.TempDir(), "empty")
	require.NoError(t, os.WriteFile(empty, []byte("\nk\n"), 0o600))
	c = Default()
	c.WorkerAPIKeyFile = empty
	assert.EqualError(t, c.ResolveSecrets(noEnv), "key worker_api_key_file: "+empty+" holds nothing on its first line")
}

// The export's headers come from tracing.headers, else from
// OpenTelemetry's environment variables, read only while tracing is on.
func TestTracingHeadersComeFromTheConfigOrTheEnvironment(t *testing.T) {
	env := func(vars map[string]string) func(string) string { return func(k string) string { return vars[k] } }
	otel := env(map[string]string{"OTEL_EXPORTER_OTLP_HEADERS": "x-tenant=acme,authorization=Bearer%20from-env"})

	c := Default()
	require.NoError(t, c.ResolveSecrets(otel))
	assert.Empty(t, c.Tracing.Headers, "tracing off: not read")

	c = Default()
	c.Tracing.OTLPEndpoint = "http://collector:4318"
	require.NoError(t, c.ResolveSecrets(otel))
	assert.Equal(t, map[string]string{"x-tenant": "acme", "authorization": "Bearer from-env"}, c.Tracing.Headers)
	out, err := c.RedactedYAML()
	require.NoError(t, err)
	assert.NotContains(t, string(out), "from-env")
	assert.Contains(t, string(out), "authorization: <redacted>")
	assert.Equal(t, "Bearer from-env", c.Tracing.Headers["authorization"], "the config itself keeps them")

	c = Default()
	c.Tracing.OTLPEndpoint = "http://collector:4318"
	c.Tracing.Headers = map[string]string{"x-honeycomb-team": "from-config"}
	require.NoError(t, c.ResolveSecrets(otel))
	assert.Equal(t, map[string]string{"x-honeycomb-team": "from-config"}, c.Tracing.Headers, "the config's win")

	c = Default()
	c.Tracing.OTLPEndpoint = "http://collector:4318"
	err = c.ResolveSecrets(env(map[string]string{"OTEL_EXPORTER_OTLP_TRACES_HEADERS": "authorization=secret-value%0D%0Ax-evil: 1"}))
	require.Error(t, err)
	assert.Equal(t, "key tracing.headers: environment variable OTEL_EXPORTER_OTLP_TRACES_HEADERS: header 1 is not a valid HTTP header", err.Error())

	_, err = Parse("f.yaml", []byte("tracing: {otlp_endpoint: 'http://c:4318', headers: {authorization: \"a\\r\\nb-secret\"}}"))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "key tracing.headers.authorization: is not a valid HTTP header value")
	assert.NotContains(t, err.Error(), "b-secret")
}
