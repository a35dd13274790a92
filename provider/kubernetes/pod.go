package kubernetes

import (
	"fmt"
	"math"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tai42/sandbox"
	"github.com/tai42/sandbox/kit"
)

// podResources are cpu and memory_mb as requests = limits: the session
// gets what it asked for and no more (Guaranteed QoS when both are set;
// one alone leaves the Pod Burstable).
func podResources(spec sandbox.SessionSpec) corev1.ResourceRequirements {
	rl := corev1.ResourceList{}
	if spec.CPU > 0 {
		rl[corev1.ResourceCPU] = *resource.NewMilliQuantity(milliCPU(spec.CPU), resource.DecimalSI)
	}
	if spec.MemoryMB > 0 {
		rl[corev1.ResourceMemory] = *resource.NewQuantity(int64(spec.MemoryMB)<<20, resource.BinarySI)
	}
	if len(rl) == 0 {
		return corev1.ResourceRequirements{}
	}
	return corev1.ResourceRequirements{Requests: rl.DeepCopy(), Limits: rl}
}

// diskLimit adds the session's cap on its node's disk to rr: an
// ephemeral-storage limit of DiskMB (DefaultDiskMB when 0), none with
// DiskOff. The request is an explicit 0, since one left out defaults to
// the limit: the scheduler would then reserve the whole cap on the node
// for every session (and place none on a node that reports no ephemeral
// storage), where the cap is a bound on what a session may use, not a
// share it is promised.
func (p *provider) diskLimit(rr corev1.ResourceRequirements) corev1.ResourceRequirements {
	if p.opts.DiskOff {
		return rr
	}
	mb := p.opts.DiskMB
	if mb == 0 {
		mb = DefaultDiskMB
	}
	rr = *rr.DeepCopy()
	if rr.Limits == nil {
		rr.Limits = corev1.ResourceList{}
	}
	if rr.Requests == nil {
		rr.Requests = corev1.ResourceList{}
	}
	rr.Limits[corev1.ResourceEphemeralStorage] = *resource.NewQuantity(int64(mb)<<20, resource.BinarySI)
	rr.Requests[corev1.ResourceEphemeralStorage] = *resource.NewQuantity(0, resource.BinarySI)
	return rr
}

// milliCPU is cpu in millicores, rounded up (a cap never below what was
// asked), except that a cpu within float error of a whole millicore is
// that millicore: 2.007*1000 is 2007.0000000000002, not 2008.
func milliCPU(cpu float64) int64 {
	m := cpu * 1000
	if r := math.Round(m); math.Abs(m-r) < 1e-6 {
		return int64(r)
	}
	return int64(math.Ceil(m))
}

// restricted is a container's securityContext under the restricted Pod
// Security standard.
func (p *provider) restricted() *corev1.SecurityContext {
	return &corev1.SecurityContext{
		RunAsNonRoot:             new(true),
		RunAsUser:                new(p.uid),
		RunAsGroup:               new(p.gid),
		AllowPrivilegeEscalation: new(false),
		Privileged:               new(false),
		Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
		SeccompProfile:           &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
	}
}

// buildPod is session r's Pod, in state creating: the agent's init
// container copies /tai42 into an emptyDir, the session's container runs
// it as PID 1 listening on the Pod's loopback. pvc is the persistent
// workspace's claim ("" for an emptyDir workspace). No env value is in the
// Pod: execs get env from the provider, over the agent protocol.
func (p *provider) buildPod(r kit.Record, pvc string) (*corev1.Pod, error) {
	ann, err := recordAnnotations(r)
	if err != nil {
		return nil, err
	}
	ws := corev1.Volume{Name: volumeWorkspace, VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}
	if pvc != "" {
		ws.VolumeSource = corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: pvc}}
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name:        podName(r.ID),
			Namespace:   p.ns,
			Labels:      recordLabels(r.ID, r.Spec),
			Annotations: ann,
		},
		Spec: corev1.PodSpec{
			RestartPolicy:                 corev1.RestartPolicyNever,
			TerminationGracePeriodSeconds: new(int64(0)),
			AutomountServiceAccountToken:  new(false),
			EnableServiceLinks:            new(false),
			HostNetwork:                   false,
			HostPID:                       false,
			HostIPC:                       false,
			SecurityContext: &corev1.PodSecurityContext{
				RunAsNonRoot:   new(true),
				RunAsUser:      new(p.uid),
				RunAsGroup:     new(p.gid),
				FSGroup:        new(p.gid),
				SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
			},
			InitContainers: []corev1.Container{{
				Name:            containerInstall,
				Image:           p.opts.AgentImage,
				ImagePullPolicy: corev1.PullIfNotPresent,
				Command:         []string{"/tai42", "agent", "install", agentBinary},
				VolumeMounts:    []corev1.VolumeMount{{Name: volumeAgent, MountPath: agentDir}},
				SecurityContext: p.restricted(),
				// The copy is small; a quota keeps a Pod with limits
				// Guaranteed (every container then needs them).
				Resources: podResources(r.Spec),
			}},
			Containers: []corev1.Container{{
				Name:            containerSession,
				Image:           r.Spec.Image,
				ImagePullPolicy: corev1.PullIfNotPresent,
				Command:         []string{agentBinary, "agent", "--listen", AgentListen},
				WorkingDir:      workspaceDir,
				VolumeMounts: []corev1.VolumeMount{
					{Name: volumeAgent, MountPath: agentDir, ReadOnly: true},
					{Name: volumeWorkspace, MountPath: workspaceDir},
				},
				// The kubelet counts the Pod's emptyDirs (the workspace)
				// against the sum of its containers' limits: this one's.
				Resources:       p.diskLimit(podResources(r.Spec)),
				SecurityContext: p.restricted(),
			}},
			Volumes: []corev1.Volume{
				{Name: volumeAgent, VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
				ws,
			},
		},
	}
	for _, s := range p.opts.ImagePullSecrets {
		pod.Spec.ImagePullSecrets = append(pod.Spec.ImagePullSecrets, corev1.LocalObjectReference{Name: s})
	}
	switch r.Spec.Isolation {
	case sandbox.IsolationVM:
		if p.opts.RuntimeClass == "" {
			return nil, fmt.Errorf("kubernetes: isolation vm without a RuntimeClass") // the kit rejects it first
		}
		pod.Spec.RuntimeClassName = new(p.opts.RuntimeClass)
	}
	return pod, nil
}
