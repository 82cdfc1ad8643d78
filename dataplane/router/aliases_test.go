package router

import (
	"encoding/json"
	"fmt"
	"mime/multipart"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/fastroute/fastroute/dataplane"
	"github.com/fastroute/fastroute/dataplane/aliases"
	"github.com/fastroute/fastroute/dataplane/config"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A model alias sends its requests to its targets by weight, each with
// the body's model rewritten to its target (the engine serves and echoes
// the target), whatever the spacing of the body or the escapes of the
// field's name; a session keeps its target; the alias is listed among
// the models and counted by target; a form may not name one; a reload
// moves the weights.
func TestAModelAliasSplitsRequestsBetweenItsTargets(t *testing.T) {
	opts := mocks(3, 2, 0)
	opts[0].Model, opts[1].Model, opts[2].Model = "food-review-v1", "food-review-v2", "llama"
	f := startFleet(t, opts, func(c *config.Config) {
		c.Router.SessionAffinity.Mode = "soft"
		c.ModelAliases = []aliases.Alias{
			{Name: "food-review", Targets: []aliases.Target{{Model: "food-review-v1", Weight: 3}, {Model: "food-review-v2", Weight: 1}}},
			{Name: "gpt-4o", Targets: []aliases.Target{{Model: "llama"}}},
		}
	})
	require.Eventually(t, func() bool {
		return f.r.Registry.Snapshot().ModelGroup([]byte("llama")) != nil
	}, 5*time.Second, 10*time.Millisecond, "the health loop learns the workers' models")
	served := func(body string, headers ...string) (worker, model string) {
		t.Helper()
		code, worker, text := f.do("POST", "/v1/chat/completions", body, headers...)
		require.Equal(t, http.StatusOK, code, text)
		var answer struct{ Model string }
		require.NoError(t, json.Unmarshal([]byte(text), &answer), text)
		return worker, answer.Model
	}

	byModel := map[string]int{}
	for range 200 {
		worker, model := served(`{"model":"food-review","messages":[{"role":"user","content":"is the soup good?"}]}`)
		require.Equal(t, map[string]string{"food-review-v1": "1", "food-review-v2": "2"}[model], worker,
			"the engine got the target as its model, and routing the target's workers")
		byModel[model]++
	}
	assert.InDelta(t, 150, byModel["food-review-v1"], 35, "3 of 4 (the bound is 5 standard deviations)")
	assert.Equal(t, 200, byModel["food-review-v1"]+byModel["food-review-v2"])

	for _, body := range []string{
		`{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}]}`,
		"{ \"messages\" : [ {\"role\":\"user\",\"content\":\"\\\"model\\\": \\\"gpt-4o\\\"\"} ] ,\n\t\"model\"\r\n:\t\"gpt-4o\" }",
		`{"mod\u0065l":"gpt-4o","n":1,"messages":[{"role":"user","content":"hi"}],"stop":null}`,
	} {
		worker, model := served(body)
		assert.Equal(t, "3", worker, body)
		assert.Equal(t, "llama", model, body)
	}
	resp, text := f.send("POST", "/v1/chat/completions", `{"model":"gpt-4o","stream":true,"messages":[{"role":"user","content":"hi"}]}`)
	require.Equal(t, http.StatusOK, resp.StatusCode, text)
	assert.Contains(t, text, `"model":"llama"`, "a stream is served by the target too")

	for s := range 8 {
		session := fmt.Sprintf("session-%d", s)
		_, first := served(`{"model":"food-review","messages":[]}`, "x-session-id", session)
		byModel[first]++
		for range 3 {
			_, again := served(`{"model":"food-review","messages":[]}`, "x-session-id", session)
			assert.Equal(t, first, again, "a session keeps its target")
			byModel[again]++
		}
	}

	_, listing := f.send("GET", "/v1/models", "")
	assert.Contains(t, listing, `"id":"food-review"`)
	assert.Contains(t, listing, `"id":"gpt-4o"`)
	for model, n := range map[string]int{"food-review-v1": byModel["food-review-v1"], "food-review-v2": byModel["food-review-v2"]} {
		assert.Equal(t, fmt.Sprint(n), metric(t, f, `fastroute_model_alias_requests_total{alias="food-review",model="`+model+`"}`))
	}
	assert.Equal(t, "4", metric(t, f, `fastroute_model_alias_requests_total{alias="gpt-4o",model="llama"}`))
	assert.Equal(t, "3", metric(t, f, `fastroute_model_alias_weight{alias="food-review",model="food-review-v1"}`))

	body, ct := aliasForm("gpt-4o")
	resp = f.post("/v1/audio/transcriptions", body, "Content-Type", ct)
	assert.Equal(t, http.StatusBadRequest, resp.StatusCode)
	assert.Contains(t, readAll(t, resp), `model \"gpt-4o\" is an alias, which only a JSON body may name`)

	next := f.r.CurrentConfig()
	next.ModelAliases = []aliases.Alias{{Name: "food-review", Targets: []aliases.Target{{Model: "food-review-v1", Weight: 0}, {Model: "food-review-v2", Weight: 1}}}}
	applied, _, err := f.r.Reload(next)
	require.NoError(t, err)
	assert.Contains(t, applied, "model_aliases (1)")
	assert.Equal(t, fmt.Sprint(byModel["food-review-v2"]), metric(t, f, `fastroute_model_alias_requests_total{alias="food-review",model="food-review-v2"}`),
		"a reload keeps the counts of the targets it keeps")
	for range 20 {
		worker, model := served(`{"model":"food-review","messages":[]}`)
		assert.Equal(t, "2", worker)
		assert.Equal(t, "food-review-v2", model, "v1's weight is 0 now")
	}
	code, _, text := f.do("POST", "/v1/chat/completions", `{"model":"gpt-4o","messages":[]}`)
	assert.Equal(t, http.StatusNotFound, code, "gpt-4o is no alias any more, and no worker serves it: %s", text)
	f.assertIdle()

	// The requests by model count them under the model they were routed
	// as, the target, from the moment it was known.
	assert.Equal(t, fmt.Sprint(byModel["food-review-v1"]), metric(t, f, `fastroute_model_requests_total{model="food-review-v1",outcome="ok"}`))
	assert.Equal(t, fmt.Sprint(byModel["food-review-v2"]+20), metric(t, f, `fastroute_model_requests_total{model="food-review-v2",outcome="ok"}`))
	assert.Equal(t, "4", metric(t, f, `fastroute_model_requests_total{model="llama",outcome="ok"}`), "three bodies and a stream")
	assert.Equal(t, "4", metric(t, f, `fastroute_model_request_seconds_count{model="llama"}`))
	assert.Equal(t, "1", metric(t, f, `fastroute_model_requests_total{model="gpt-4o",outcome="invalid"}`), "routed as gpt-4o, which no worker serves")
	assert.Equal(t, "", metric(t, f, `fastroute_model_requests_total{model="food-review",outcome="ok"}`), "an alias is no model requests are routed as")
}

func aliasForm(model string) (string, string) {
	var b strings.Builder
	mw := multipart.NewWriter(&b)
	_ = mw.WriteField("model", model)
	_ = mw.Close()
	return b.String(), mw.FormDataContentType()
}

// Both legs of a split request get the alias's target as their model:
// the prefill body and the decode body are made from the rewritten one.
func TestBothLegsOfASplitRequestGetTheAliasTarget(t *testing.T) {
	prefill, decode := startEngine(t, vllmPrefill), startEngine(t, sseDecode)
	f := startPD(t, config.DisaggVLLM, []pdWorker{{dataplane.RolePrefill, prefill.URL}, {dataplane.RoleDecode, decode.URL}},
		func(c *config.Config) {
			c.ModelAliases = []aliases.Alias{{Name: "m-latest", Targets: []aliases.Target{{Model: "m"}}}}
		})
	resp, text := f.send("POST", "/v1/chat/completions", strings.Replace(pdBody, `"model":"m"`, `"model":"m-latest"`, 1))
	require.Equal(t, http.StatusOK, resp.StatusCode, text)
	assert.Contains(t, text, "d2")
	for leg, e := range map[string]*standIn{"prefill": prefill, "decode": decode} {
		got := e.received()
		require.Len(t, got, 1, leg)
		assert.Equal(t, "m", got[0].body["model"], leg)
	}
	assert.Equal(t, true, decode.received()[0].body["stream"], "the rest of the body as it was")
	f.assertIdle()
}

// A fallback alias's requests go to its first target a routable worker
// serves: the big model while its worker is up, the small one once the
// health check takes the big one's worker out.
func TestAFallbackAliasMovesToItsNextTargetWhenTheFirstIsDown(t *testing.T) {
	opts := mocks(2, 2, 0)
	opts[0].Model, opts[1].Model = "big", "small"
	f := startFleet(t, opts, func(c *config.Config) {
		c.ModelAliases = []aliases.Alias{{Name: "chat", Fallback: true, Targets: []aliases.Target{{Model: "big"}, {Model: "small"}}}}
	})
	require.Eventually(t, func() bool {
		return f.r.Registry.Snapshot().ModelGroup([]byte("small")) != nil
	}, 5*time.Second, 10*time.Millisecond, "the health loop learns the workers' models")
	const body = `{"model":"chat","messages":[{"role":"user","content":"hi"}]}`
	for range 5 {
		code, worker, text := f.do("POST", "/v1/chat/completions", body)
		require.Equal(t, http.StatusOK, code, text)
		assert.Equal(t, "1", worker)
		assert.Contains(t, text, `"model":"big"`)
	}
	f.mocks[0].Close()
	require.Eventually(t, func() bool { return !f.r.Registry.Snapshot().Has(1) }, 5*time.Second, 10*time.Millisecond,
		"the health check takes the big model's worker out")
	for range 5 {
		code, worker, text := f.do("POST", "/v1/chat/completions", body)
		require.Equal(t, http.StatusOK, code, text)
		assert.Equal(t, "2", worker)
		assert.Contains(t, text, `"model":"small"`)
	}
	assert.Equal(t, "5", metric(t, f, `fastroute_model_alias_requests_total{alias="chat",model="big"}`))
	assert.Equal(t, "5", metric(t, f, `fastroute_model_alias_requests_total{alias="chat",model="small"}`))
	f.assertIdle()
}

// An API key's models= names what its client may ask for: an alias it
// lists opens the alias's targets to it, and a target it does not list
// stays closed when named directly.
func TestAKeysModelsAreCheckedAgainstTheAliasNamed(t *testing.T) {
	opts := mocks(1, 2, 0)
	opts[0].Model = "llama-70b"
	f := startFleet(t, opts, func(c *config.Config) {
		c.APIKeysFile = keysFile(t, "team-a "+teamAKey+" models=assistant")
		c.ModelAliases = []aliases.Alias{{Name: "assistant", Targets: []aliases.Target{{Model: "llama-70b"}}}}
	})
	require.Eventually(t, func() bool {
		return f.r.Registry.Snapshot().Catalog().HasModel([]byte("llama-70b"))
	}, 5*time.Second, 10*time.Millisecond, "the health loop learns the worker's model")
	code, _, text := f.do("POST", "/v1/chat/completions", `{"model":"assistant","messages":[]}`, "Authorization", "Bearer "+teamAKey)
	require.Equal(t, http.StatusOK, code, text)
	assert.Contains(t, text, `"model":"llama-70b"`)
	code, _, text = f.do("POST", "/v1/chat/completions", `{"model":"llama-70b","messages":[]}`, "Authorization", "Bearer "+teamAKey)
	assert.Equal(t, http.StatusForbidden, code, text)
	_, listing := f.send("GET", "/v1/models", "", "Authorization", "Bearer "+teamAKey)
	assert.Contains(t, listing, `"id":"assistant"`)
	assert.NotContains(t, listing, `"id":"llama-70b"`)
	f.assertIdle()
}
