package kubernetes

import (
	"errors"
	"io"
	"os"
	"slices"
	"strings"
	"testing"

	authv1 "k8s.io/api/authorization/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
)

// readmeRBAC is the RBAC the README tells an operator to apply: its Role
// (the namespace's verbs) and ClusterRole (the cluster-wide reads), from
// the first `kubectl apply` heredoc that holds a Role.
func readmeRBAC(t testing.TB) (role *rbacv1.Role, cluster *rbacv1.ClusterRole) {
	t.Helper()
	b, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	const open, end = "<<'YAML'\n", "\nYAML\n"
	for rest := string(b); ; {
		i := strings.Index(rest, open)
		if i < 0 {
			t.Fatal("README.md: no kubectl apply heredoc holds a Role")
		}
		rest = rest[i+len(open):]
		j := strings.Index(rest, end)
		if j < 0 {
			t.Fatal("README.md: a YAML heredoc does not end")
		}
		block := rest[:j]
		rest = rest[j:]
		if !strings.Contains(block, "\nkind: Role\n") {
			continue
		}
		dec := utilyaml.NewYAMLOrJSONDecoder(strings.NewReader(block), 4096)
		for {
			var doc struct {
				Kind  string              `json:"kind"`
				Rules []rbacv1.PolicyRule `json:"rules"`
			}
			if err := dec.Decode(&doc); errors.Is(err, io.EOF) {
				break
			} else if err != nil {
				t.Fatalf("README.md's RBAC YAML: %v", err)
			}
			switch doc.Kind {
			case "Role":
				role = &rbacv1.Role{Rules: doc.Rules}
			case "ClusterRole":
				cluster = &rbacv1.ClusterRole{Rules: doc.Rules}
			}
		}
		if role == nil || cluster == nil {
			t.Fatal("README.md's RBAC YAML has no Role or no ClusterRole")
		}
		return role, cluster
	}
}

// grants expands rules into "verb group/resource[/subresource]" strings,
// as resourceName names them.
func grants(rules []rbacv1.PolicyRule) []string {
	var out []string
	for _, r := range rules {
		for _, g := range r.APIGroups {
			for _, res := range r.Resources {
				sub := ""
				if i := strings.IndexByte(res, '/'); i >= 0 {
					res, sub = res[:i], res[i+1:]
				}
				for _, v := range r.Verbs {
					out = append(out, v+" "+resourceName(authv1.ResourceAttributes{Group: g, Resource: res, Subresource: sub}))
				}
			}
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// uses is what the provider checks at New, in grants' form.
func uses(attrs []authv1.ResourceAttributes) []string {
	var out []string
	for _, a := range attrs {
		out = append(out, a.Verb+" "+resourceName(a))
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// compareGrants fails t for each verb granted and never used, and each
// used and not granted.
func compareGrants(t *testing.T, what string, granted, used []string) {
	t.Helper()
	for _, g := range granted {
		if !slices.Contains(used, g) {
			t.Errorf("the README's %s grants %q, which the provider never uses", what, g)
		}
	}
	for _, u := range used {
		if !slices.Contains(granted, u) {
			t.Errorf("the README's %s does not grant %q, which the provider uses", what, u)
		}
	}
}

// TestReadmeRBACIsWhatTheProviderUses: the Role and ClusterRole the README
// has an operator apply grant exactly the verbs New checks (permissions,
// clusterPermissions and the RuntimeClass of isolation vm), no more: a
// verb granted and never used (a watch on Secrets) is a daemon's
// credential reaching further than the daemon needs. That New's list is
// every verb the provider's code uses is TestRBACSuffices'.
func TestReadmeRBACIsWhatTheProviderUses(t *testing.T) {
	role, cluster := readmeRBAC(t)
	compareGrants(t, "Role", grants(role.Rules), uses(permissions))
	clusterUses := append(slices.Clone(clusterPermissions),
		authv1.ResourceAttributes{Verb: "get", Group: "node.k8s.io", Resource: "runtimeclasses"})
	compareGrants(t, "ClusterRole", grants(cluster.Rules), uses(clusterUses))
}
