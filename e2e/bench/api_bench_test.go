package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/IniZio/nexus/gateway/httpapi"
)

// BenchmarkExecAPI is the exec round trip of `true` through the HTTP API (POST exec, and a
// WebSocket per command) against the same through `nexus exec` (the CLI over the bus) and the
// bus client alone, each iteration one of each, on one sandbox. http-vs-cli is the issue's
// ratio (issue 27); http-vs-bus is what the HTTP hop itself costs.
func BenchmarkExecAPI(b *testing.B) {
	const name = "bench/api"
	sandbox(b, name)
	ctx := context.Background()
	path := apiURL + "/v1/sandboxes/" + url.PathEscape(name)
	post := func() error {
		req, _ := http.NewRequest("POST", path+"/exec", strings.NewReader(`{"argv":["true"]}`))
		req.Header.Set("Authorization", "Bearer "+apiToken)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		var res struct {
			ExitCode int `json:"exit_code"`
		}
		if err := json.NewDecoder(resp.Body).Decode(&res); err != nil || resp.StatusCode != 200 || res.ExitCode != 0 {
			return fmt.Errorf("POST exec: %d %v %+v", resp.StatusCode, err, res)
		}
		return nil
	}
	ws := func() error {
		u := strings.Replace(path, "http", "ws", 1) + "/exec/ws?argv=true"
		c, _, err := websocket.DefaultDialer.Dial(u, http.Header{"Authorization": {"Bearer " + apiToken}})
		if err != nil {
			return err
		}
		defer c.Close()
		for {
			kind, data, err := c.ReadMessage()
			if err != nil {
				return err
			}
			if kind == websocket.TextMessage {
				var m httpapi.WSControl
				json.Unmarshal(data, &m)
				if m.Type != "exit" || m.ExitCode != 0 {
					return fmt.Errorf("websocket exec: %s", data)
				}
				return nil
			}
		}
	}
	cli := func() error {
		cmd := stack.Command("exec", name, "--", "true")
		cmd.Stdout, cmd.Stderr = io.Discard, io.Discard
		return cmd.Run()
	}
	busExec := func() error { return exec(ctx, name, "true") }
	kinds := []struct {
		name string
		fn   func() error
		lat  []time.Duration
	}{{"bus", busExec, nil}, {"cli", cli, nil}, {"http", post, nil}, {"ws", ws, nil}}
	for i := range kinds {
		if err := kinds[i].fn(); err != nil { // warm
			b.Fatalf("%s: %v", kinds[i].name, err)
		}
	}
	for b.Loop() {
		for i := range kinds {
			t0 := time.Now()
			if err := kinds[i].fn(); err != nil {
				b.Fatalf("%s: %v", kinds[i].name, err)
			}
			kinds[i].lat = append(kinds[i].lat, time.Since(t0))
		}
	}
	p50 := map[string]float64{}
	for _, k := range kinds {
		p50[k.name] = percentile(k.lat, 0.5)
		b.ReportMetric(p50[k.name], k.name+"-p50-ms")
	}
	if p50["cli"] > 0 && p50["bus"] > 0 {
		b.ReportMetric(p50["http"]/p50["cli"], "http-vs-cli")
		b.ReportMetric(p50["ws"]/p50["cli"], "ws-vs-cli")
		b.ReportMetric(p50["http"]/p50["bus"], "http-vs-bus")
	}
}
