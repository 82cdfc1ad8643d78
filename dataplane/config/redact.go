package config

import (
	"maps"
	"net/url"

	"gopkg.in/yaml.v3"
)

// Redacted is what a secret reads as in Redacted's config.
const Redacted = "<redacted>"

// Redacted returns the config with each secret that is set replaced by
// Redacted: admin_token and worker_api_key (read from their files or the
// environment too, by ResolveSecrets), discovery.etcd.password, the
// password of tracing.otlp_endpoint's URL and the values of
// tracing.headers (the environment's too). The clients' API keys are never
// part of the YAML. The files' paths are kept: they are no secrets.
func (c Config) Redacted() Config {
	for _, s := range []*string{&c.AdminToken, &c.WorkerAPIKey, &c.Discovery.Etcd.Password} {
		if *s != "" {
			*s = Redacted
		}
	}
	if u, err := url.Parse(c.Tracing.OTLPEndpoint); err == nil && u.User != nil {
		if _, set := u.User.Password(); set {
			u.User = url.UserPassword(u.User.Username(), Redacted)
			c.Tracing.OTLPEndpoint = u.String()
		}
	}
	if len(c.Tracing.Headers) > 0 {
		c.Tracing.Headers = maps.Clone(c.Tracing.Headers)
		for name := range c.Tracing.Headers {
			c.Tracing.Headers[name] = Redacted
		}
	}
	return c
}

// RedactedYAML is the config as YAML, its secrets redacted (Redacted):
// what the admin listener's GET /config shows. Parse reads it back.
func (c Config) RedactedYAML() ([]byte, error) { return yaml.Marshal(c.Redacted()) }
