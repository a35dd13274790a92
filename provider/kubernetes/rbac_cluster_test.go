package kubernetes

import (
	"context"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	authv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8s "k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/tai42/sandbox"
	"github.com/tai42/sandbox/kit"
	"github.com/tai42/sandbox/provider/kubernetes/kubetest"
)

// requestLog records the verb and resource of every request a client
// makes, as the apiserver's authorizer sees them ("verb group/resource
// [/subresource]", as resourceName writes them).
type requestLog struct {
	mu   sync.Mutex
	seen map[string]string // verb and resource -> one request's method and path
}

func (l *requestLog) wrap(rt http.RoundTripper) http.RoundTripper {
	return roundTripFunc(func(r *http.Request) (*http.Response, error) {
		if what := authzAttributes(r); what != "" {
			l.mu.Lock()
			if l.seen == nil {
				l.seen = map[string]string{}
			}
			l.seen[what] = r.Method + " " + r.URL.Path
			l.mu.Unlock()
		}
		return rt.RoundTrip(r)
	})
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// authzAttributes is the verb and resource the apiserver authorizes r as,
// "" for a non-resource path (/version). The paths are the API's:
// /api/v1[/namespaces/NS]/RESOURCE[/NAME[/SUB]] and
// /apis/GROUP/VERSION[/namespaces/NS]/RESOURCE[/NAME[/SUB]].
func authzAttributes(r *http.Request) string {
	parts := strings.Split(strings.Trim(r.URL.Path, "/"), "/")
	var group string
	switch {
	case len(parts) >= 3 && parts[0] == "api":
		parts = parts[2:]
	case len(parts) >= 4 && parts[0] == "apis":
		group, parts = parts[1], parts[3:]
	default:
		return ""
	}
	// A namespaced path, unless it names a namespace itself.
	if len(parts) >= 3 && parts[0] == "namespaces" {
		parts = parts[2:]
	}
	a := authv1.ResourceAttributes{Group: group, Resource: parts[0]}
	named := len(parts) >= 2
	if len(parts) >= 3 {
		a.Subresource = parts[2]
	}
	switch r.Method {
	case http.MethodGet:
		switch {
		case named:
			a.Verb = "get"
		case r.URL.Query().Get("watch") == "true" || r.URL.Query().Get("watch") == "1":
			a.Verb = "watch"
		default:
			a.Verb = "list"
		}
	case http.MethodPost:
		a.Verb = "create"
	case http.MethodPut:
		a.Verb = "update"
	case http.MethodPatch:
		a.Verb = "patch"
	case http.MethodDelete:
		a.Verb = "delete"
		if !named {
			a.Verb = "deletecollection"
		}
	default:
		a.Verb = strings.ToLower(r.Method)
	}
	return a.Verb + " " + resourceName(a)
}

// unexercised are the verbs New checks that TestRBACSuffices's run does
// not reach, each with the path of the code that uses it.
var unexercised = map[string]string{
	"update networking.k8s.io/networkpolicies": "a tier policy found changed is put back",
	"list storage.k8s.io/storageclasses":       "persistent workspaces on the cluster's default StorageClass",
	"get node.k8s.io/runtimeclasses":           "isolation vm",
}

// alwaysAllowed are requests every authenticated user may make: New's
// own checks (its reading of the namespace is optional).
var alwaysAllowed = []string{
	"create authorization.k8s.io/selfsubjectaccessreviews",
	"get namespaces",
}

// TestRBACSuffices: the provider works as a ServiceAccount bound to
// exactly the README's Role and ClusterRole (New's check of them passes; a
// session with env values, a network tier and a persistent workspace is
// made, served, adopted by another daemon, destroyed; the workspace
// removed; a create that fails reads its Pod's events; the sweep runs),
// and each request it makes is a verb New checks, so that
// TestReadmeRBACIsWhatTheProviderUses's comparison of the README with
// New's list is one with the code's requests.
func TestRBACSuffices(t *testing.T) {
	c := kubetest.Require(t)
	ns := newNamespace(t, c)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cfg := bindReadmeRBAC(t, c, ns)
	log := &requestLog{}
	cfg.Wrap(log.wrap)

	open := func() *kit.Sandbox {
		permissive := sandbox.Policy{Egress: sandbox.NetworkEgress, Isolation: sandbox.IsolationNone, Durable: true}
		sb, err := New(Options{Options: kit.Options{Policy: permissive, ReapInterval: -1}, RESTConfig: cfg, Namespace: ns,
			AgentImage: c.AgentImage, StorageClass: c.StorageClass, TrustNetworkPolicy: c.Enforcer, CreateTimeout: 90 * time.Second})
		if err != nil {
			t.Fatalf("New as the README's ServiceAccount: %v", err)
		}
		return sb
	}
	sb := open()
	spec := sandbox.SessionSpec{Image: c.Busybox, Durability: sandbox.Persistent, WorkspaceKey: "rbac", Network: sandbox.NetworkInternal,
		TTLSeconds: 300, Env: map[string]sandbox.Secret{"TOKEN": sandbox.NewSecret("rbac-9d2e")}}
	s, err := sb.CreateSession(ctx, spec)
	if err != nil {
		t.Fatalf("create as the README's ServiceAccount: %v", err)
	}
	id := s.ID()
	sb.Abandon()
	// Another daemon's: it adopts the session and reads its env Secret.
	sb = open()
	defer func() {
		if err := sb.Close(context.Background()); err != nil {
			t.Errorf("close: %v", err)
		}
	}()
	if s, err = sb.GetSession(ctx, id); err != nil {
		t.Fatal(err)
	}
	res, err := s.Exec(ctx, []string{"sh", "-c", "echo $TOKEN"}, sandbox.ExecOptions{Timeout: 30 * time.Second})
	if err != nil || strings.TrimSpace(string(res.Stdout)) != "rbac-9d2e" {
		t.Fatalf("exec in the adopted session: %v %q", err, res.Stdout)
	}
	if err := sb.DestroySession(ctx, id); err != nil {
		t.Fatalf("destroy: %v", err)
	}
	if err := sb.RemoveWorkspace(ctx, "rbac"); err != nil {
		t.Fatalf("remove the workspace: %v", err)
	}
	if _, err := sb.CreateSession(ctx, sandbox.SessionSpec{Image: "127.0.0.1:1/no/such:image", Durability: sandbox.Ephemeral,
		Network: sandbox.NetworkNone, TTLSeconds: 60}); err == nil {
		t.Fatal("a create of an image nobody serves passed")
	}
	cs, err := k8s.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := newSweeper(cs, ns, sweepOptions{}).sweep(ctx); err != nil {
		t.Fatalf("the sweep as the README's ServiceAccount: %v", err)
	}

	checked := append(uses(permissions), uses(clusterPermissions)...)
	log.mu.Lock()
	defer log.mu.Unlock()
	for what, req := range log.seen {
		if !slices.Contains(checked, what) && !slices.Contains(alwaysAllowed, what) {
			t.Errorf("the provider made %s (%s), a verb New does not check (add it to permissions and the README's Role)", what, req)
		}
	}
	for _, what := range append(checked, "get node.k8s.io/runtimeclasses") {
		if _, ok := log.seen[what]; !ok && unexercised[what] == "" {
			t.Errorf("New checks %s, which this run never made: a verb no code uses, or a path to add here", what)
		}
	}
}

// bindReadmeRBAC makes the README's ServiceAccount, Role and ClusterRole
// in ns (the ClusterRole and its binding named after ns, removed at the
// end) and returns a config of the cluster's that acts as that
// ServiceAccount.
func bindReadmeRBAC(t *testing.T, c *kubetest.Cluster, ns string) *rest.Config {
	t.Helper()
	ctx := context.Background()
	role, cluster := readmeRBAC(t)
	const sa = "tai42"
	subjects := []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: sa, Namespace: ns}}
	if _, err := c.Client.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	role.Name = sa
	if _, err := c.Client.RbacV1().Roles(ns).Create(ctx, role, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Client.RbacV1().RoleBindings(ns).Create(ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: sa},
		RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: sa}, Subjects: subjects}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	cluster.Name = "tai42-test-" + ns
	if _, err := c.Client.RbacV1().ClusterRoles().Create(ctx, cluster, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = c.Client.RbacV1().ClusterRoles().Delete(context.Background(), cluster.Name, metav1.DeleteOptions{})
	})
	if _, err := c.Client.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: cluster.Name},
		RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: cluster.Name}, Subjects: subjects}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = c.Client.RbacV1().ClusterRoleBindings().Delete(context.Background(), cluster.Name, metav1.DeleteOptions{})
	})
	cfg := c.RESTConfig()
	cfg.Impersonate = rest.ImpersonationConfig{UserName: "system:serviceaccount:" + ns + ":" + sa}
	return cfg
}
