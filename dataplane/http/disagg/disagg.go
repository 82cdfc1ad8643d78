// Package disagg rewrites request bodies for prefill/decode
// disaggregation, in the two wire protocols engines speak:
//
//   - vLLM's KV-connector protocol (vLLM's disaggregated proxy example,
//     llm-d's sidecar): the prefill request is the client's body with
//     stream false, one token to generate and kv_transfer_params asking
//     for a remote decode; the kv_transfer_params of its answer go, as
//     they are, into the client's body sent to the decode worker.
//   - SGLang's bootstrap protocol: the same body, with the prefill
//     worker's bootstrap host, port and a random room, goes to both
//     workers at once.
//
// Bodies are JSON objects; fields the protocol does not name pass through
// with their values byte for byte (members may be reordered).
package disagg

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
)

// prefillParams are the kv_transfer_params of a vLLM prefill request.
var prefillParams = json.RawMessage(`{"do_remote_decode":true,"do_remote_prefill":false,"remote_engine_id":null,"remote_block_ids":null,"remote_host":null,"remote_port":null}`)

// object decodes a JSON object into its members, values kept raw.
func object(body []byte) (map[string]json.RawMessage, error) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(body, &m); err != nil {
		return nil, err
	}
	if m == nil {
		return nil, errors.New("body is not a JSON object")
	}
	return m, nil
}

// PrefillBody is the body of vLLM's prefill request made from the client's:
// stream false, max_tokens 1 (and max_completion_tokens 1 when present),
// no stream_options, min_tokens or min_completion_tokens, and
// kv_transfer_params asking for a remote decode.
func PrefillBody(body []byte) ([]byte, error) {
	m, err := object(body)
	if err != nil {
		return nil, err
	}
	m["stream"] = json.RawMessage("false")
	m["max_tokens"] = json.RawMessage("1")
	if _, ok := m["max_completion_tokens"]; ok {
		m["max_completion_tokens"] = json.RawMessage("1")
	}
	for _, k := range []string{"stream_options", "min_tokens", "min_completion_tokens"} {
		delete(m, k)
	}
	m["kv_transfer_params"] = prefillParams
	return json.Marshal(m)
}

// TransferParams returns the kv_transfer_params object of a vLLM prefill
// answer, as it is.
func TransferParams(answer []byte) (json.RawMessage, error) {
	m, err := object(answer)
	if err != nil {
		return nil, fmt.Errorf("answer is not a JSON object: %w", err)
	}
	p, ok := m["kv_transfer_params"]
	if !ok {
		return nil, errors.New("answer has no kv_transfer_params")
	}
	var o map[string]json.RawMessage
	if json.Unmarshal(p, &o) != nil || o == nil {
		return nil, errors.New("answer's kv_transfer_params is not an object")
	}
	return p, nil
}

// DecodeBody is the client's body with the prefill answer's
// kv_transfer_params.
func DecodeBody(body []byte, params json.RawMessage) ([]byte, error) {
	m, err := object(body)
	if err != nil {
		return nil, err
	}
	m["kv_transfer_params"] = params
	return json.Marshal(m)
}

// Room is a bootstrap room for the prefill worker's data-parallel rank
// (one of dpSize; 1: no ranks), from 64 random bits: 63 of them, so that
// it is a non-negative int64, with the residue room % dpSize set to rank.
// SGLang's decode engine looks for a request's KV cache on the prefill
// rank room % dp_size unless told another, and its prefill engine left to
// choose takes that rank too (follow_bootstrap_room); a room of another
// residue than the rank the router sent the prefill to would have the
// decode wait on the wrong rank.
func Room(random uint64, rank, dpSize int) uint64 {
	room := random >> 1
	if dpSize > 1 {
		n := uint64(dpSize)
		room += uint64(rank) - room%n
		if room > math.MaxInt64 {
			room -= n
		}
	}
	return room
}

// BootstrapBody is the client's body with SGLang's bootstrap fields: the
// prefill worker's host and bootstrap port, and the room both workers meet
// in. An IPv6 host goes in brackets, as SGLang's own gateway sends it (a
// URL's host): SGLang joins host and port as host:port, which versions
// before its NetworkAddress did as they were (an unbracketed IPv6 address
// made a URL no client could read) and later ones take either way.
func BootstrapBody(body []byte, host string, port int, room uint64) ([]byte, error) {
	m, err := object(body)
	if err != nil {
		return nil, err
	}
	if strings.Contains(host, ":") {
		host = "[" + host + "]"
	}
	h, _ := json.Marshal(host)
	m["bootstrap_host"] = h
	m["bootstrap_port"] = json.RawMessage(strconv.Itoa(port))
	m["bootstrap_room"] = json.RawMessage(strconv.FormatUint(room, 10))
	return json.Marshal(m)
}
