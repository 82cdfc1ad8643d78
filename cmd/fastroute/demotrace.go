package main

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/fastroute/fastroute/internal/otlpsink"
)

// demoTraceID is the trace of the demo's client: its request carries it
// in a sampled traceparent, as an OpenTelemetry-instrumented client's does.
const demoTraceID = "0af7651916cd43dd8448eb211c80319c"

// demoTrace sends one stream request in the client's trace and shows the
// router's span of it, as the demo's OTLP receiver (sink) got it.
func demoTrace(client *http.Client, base string, sink *otlpsink.Sink) (string, error) {
	req, err := http.NewRequest(http.MethodPost, base+"/v1/chat/completions",
		strings.NewReader(`{"model":"mock-model","stream":true,"messages":[{"role":"user","content":"traced"}]}`))
	if err != nil {
		return "", err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("traceparent", "00-"+demoTraceID+"-b7ad6b7169203331-01")
	resp, err := client.Do(req)
	if err != nil {
		return "", err
	}
	_, err = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if err != nil || resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("status %d, %v", resp.StatusCode, err)
	}
	for deadline := time.Now().Add(3 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if s, ok := sink.SpanOf(demoTraceID); ok {
			var steps []string
			for _, e := range s.Events {
				steps = append(steps, fmt.Sprintf("%s +%.1f ms", e.Name, float64(e.TimeUnixNano-s.StartTimeUnixNano)/1e6))
			}
			return fmt.Sprintf("traced     %s in the client's trace %s…: span %x -> worker %v, %s, ends +%.1f ms (%d spans at the demo's OTLP receiver)",
				s.Name, demoTraceID[:8], s.SpanId, s.Attr("fastroute.worker.id"), strings.Join(steps, ", "),
				float64(s.EndTimeUnixNano-s.StartTimeUnixNano)/1e6, len(sink.Spans())), nil
		}
	}
	return "", fmt.Errorf("the span of trace %s did not reach the OTLP receiver (%d spans did)", demoTraceID, len(sink.Spans()))
}
