// Command karpenter-kwok is Karpenter's own KWOK reference operator (sigs.k8s.io/karpenter/kwok,
// unchanged) with one repair policy added: the Node condition gpu-healthcheck writes for node
// repair (AcceleratedHardwareReady=False, as Karpenter's AWS provider declares it). The test suite
// runs it against its real kube-apiserver to prove that Karpenter's node repair replaces a node
// whose condition says the GPU is broken, and leaves alone one whose condition is True or Unknown.
//
// The policy's toleration is the AWS provider's 10 minutes unless GPUHC_REPAIR_TOLERATION (a Go
// duration) shortens it for a test; GPUHC_REPAIR_CONDITION renames the condition type.
package main

import (
	"os"
	"time"

	"github.com/samber/lo"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/log"

	kwok "sigs.k8s.io/karpenter/kwok/cloudprovider"
	"sigs.k8s.io/karpenter/pkg/cloudprovider"
	"sigs.k8s.io/karpenter/pkg/cloudprovider/overlay"
	"sigs.k8s.io/karpenter/pkg/controllers"
	"sigs.k8s.io/karpenter/pkg/controllers/node/health"
	"sigs.k8s.io/karpenter/pkg/controllers/state"
	"sigs.k8s.io/karpenter/pkg/operator"
)

// provider is the KWOK cloud provider with the GPU repair policy appended to its own.
type provider struct {
	*kwok.CloudProvider
	policy cloudprovider.RepairPolicy
}

func (p provider) RepairPolicies() []cloudprovider.RepairPolicy {
	return append(p.CloudProvider.RepairPolicies(), p.policy)
}

func gpuPolicy() cloudprovider.RepairPolicy {
	toleration := 10 * time.Minute // the AWS provider's AcceleratedHardwareReady toleration
	if v := os.Getenv("GPUHC_REPAIR_TOLERATION"); v != "" {
		toleration = lo.Must(time.ParseDuration(v))
	}
	condition := corev1.NodeConditionType("AcceleratedHardwareReady")
	if v := os.Getenv("GPUHC_REPAIR_CONDITION"); v != "" {
		condition = corev1.NodeConditionType(v)
	}
	return cloudprovider.RepairPolicy{
		ConditionType:      condition,
		ConditionStatus:    corev1.ConditionFalse,
		ReasonRegex:        ".*", // the KWOK set's fallback (Ready=False) stays its only fallback
		TolerationDuration: toleration,
		Action:             cloudprovider.ReplaceNode,
	}
}

// main is kwok/main.go of sigs.k8s.io/karpenter with the provider wrapped.
func main() {
	ctx, op := operator.NewOperator()
	instanceTypes, err := kwok.ConstructInstanceTypes(ctx)
	if err != nil {
		log.FromContext(ctx).Error(err, "failed constructing instance types")
	}
	undecorated := provider{kwok.NewCloudProvider(ctx, op.GetClient(), instanceTypes), gpuPolicy()}
	cloudProvider := overlay.Decorate(undecorated, op.GetClient(), op.InstanceTypeStore)
	repairPolicyMatcher := lo.Must(health.NewRepairPolicyMatcher(ctx, cloudProvider))
	clusterState := state.NewCluster(op.Clock, op.GetClient(), cloudProvider, state.WithRepairPolicyMatcher(repairPolicyMatcher))
	op.
		WithControllers(ctx, controllers.NewControllers(
			ctx,
			op.Manager,
			op.Clock,
			op.GetClient(),
			op.EventRecorder,
			cloudProvider,
			undecorated,
			clusterState,
			op.InstanceTypeStore,
			op.PredictionStore,
		)...).Start(ctx)
}
