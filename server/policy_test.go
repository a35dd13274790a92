package server

import (
	"encoding/json"
	"io"
	"net/http"
	"reflect"
	"testing"

	"github.com/tai42/sandbox/api"
)

// TestPolicyReportsFences: GET /v1/policy carries the egress fences and the
// disk cap the daemon was given, beside the policy's own fields; without
// them it is the policy alone.
func TestPolicyReportsFences(t *testing.T) {
	fences := &api.EgressFences{Enforced: true, Refused: []string{"10.0.0.0/8", "host-networks"},
		Allow: []string{"10.20.0.0/16"}, Deny: []string{}, AllowDomains: []string{"*.example.org"},
		Resolver: "10.242.128.1", Upstreams: []string{"127.0.0.53:53"}}
	disk := &api.DiskCap{Enforced: true, MB: 512, Inodes: 32768, ReserveMB: 64}
	e := newEnv(t, func(o *Options) { o.EgressFences, o.Disk = fences, disk })
	var got api.PolicyInfo
	e.call("GET", "/v1/policy", nil, http.StatusOK, &got)
	if want := (api.PolicyInfo{Policy: testPolicy, EgressFences: fences, Disk: disk}); !reflect.DeepEqual(got, want) {
		t.Errorf("GET /v1/policy = %+v, want %+v", got, want)
	}

	bare := newEnv(t)
	req, _ := http.NewRequest("GET", bare.ts.URL+"/v1/policy", nil)
	req.Header.Set("Authorization", "Bearer "+testToken)
	resp, err := bare.hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var fields map[string]any
	if err := json.Unmarshal(b, &fields); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"egress_fences", "disk"} {
		if _, ok := fields[k]; ok {
			t.Errorf("GET /v1/policy without fences has %q: %s", k, b)
		}
	}
	if len(fields) != 4 {
		t.Errorf("GET /v1/policy without fences: %s, want the policy's four fields", b)
	}
}
