package config

import (
	"testing"

	"github.com/fastroute/fastroute/dataplane/apikeys"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The running config's YAML hides every secret set, keeps the rest, and
// parses back into the same config.
func TestTheRedactedYAMLHidesTheSecretsAndParsesBack(t *testing.T) {
	c, err := Parse("f.yaml", []byte(`
router: {mode: least-loaded, retries: 1, retry_budget: {percent: 20}}
limits: {max_body_bytes: 8MiB}
health: {interval: 1500ms}
workers: [{id: 1, url: "http://10.0.0.1:8000", models: [llama]}]
model_aliases: [{name: chat, targets: [{model: llama}]}]
model_mirrors: [{model: llama, to: llama-next, percent: 5}]
api_keys_file: /etc/fastroute/keys
tracing: {otlp_endpoint: "http://collector:4318/v1/traces", sample_ratio: 0.1}
`))
	require.NoError(t, err)
	plain, err := c.RedactedYAML()
	require.NoError(t, err)
	back, err := Parse("running.yaml", plain)
	require.NoError(t, err, "%s", plain)
	again, err := back.RedactedYAML()
	require.NoError(t, err)
	assert.Equal(t, string(plain), string(again), "the YAML says all the config holds (an empty list reads back empty, not nil)")
	assert.Equal(t, c.Router.RetryBudget, back.Router.RetryBudget)
	assert.Equal(t, c.Router.Mode, back.Router.Mode)
	assert.Equal(t, c.Limits, back.Limits)
	assert.Equal(t, c.ModelMirrors, back.ModelMirrors)
	assert.Equal(t, c.Health, back.Health)
	assert.Equal(t, c.Tracing, back.Tracing)

	c.AdminToken, c.WorkerAPIKey, c.Discovery.Etcd.Password = "admin-secret-0123", "engine-secret-4567", "etcd-secret-89ab"
	c.APIKeys = []apikeys.Entry{{Name: "team-a", Key: "sk-team-a-secret"}}
	c.Tracing.OTLPEndpoint = "https://tenant:otlp-secret-cdef@collector.example/v1/traces"
	out, err := c.RedactedYAML()
	require.NoError(t, err)
	for _, secret := range []string{"admin-secret-0123", "engine-secret-4567", "etcd-secret-89ab", "sk-team-a-secret", "otlp-secret-cdef"} {
		assert.NotContains(t, string(out), secret)
	}
	assert.Contains(t, string(out), "admin_token: <redacted>")
	assert.Contains(t, string(out), "worker_api_key: <redacted>")
	assert.Contains(t, string(out), "password: <redacted>")
	assert.Contains(t, string(out), "api_keys_file: /etc/fastroute/keys")
	assert.Contains(t, string(out), "otlp_endpoint: https://tenant:%3Credacted%3E@collector.example/v1/traces", "the URL's user stays")
	assert.Equal(t, "admin-secret-0123", c.AdminToken, "the config itself keeps them")
}
