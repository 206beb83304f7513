// Package nodemove is the policy for a node moving between the two kubelet
// plugins (device plugin and nvinject-dra) under running pods:
//
//   - A GPU that a pod got through the other path is not handed out again
//     until that pod ends: the Watcher reads kubelet's PodResources for the
//     other path's holders, and a Set keeps what the daemon withholds,
//     every GPU while PodResources cannot be read (fail closed). Neither
//     the scheduler nor the daemon itself otherwise knows the other path's
//     pods.
//   - nvinject-dra stopping on a node moved away from DRA deletes the
//     node's ResourceSlices at once (ReleaseIfMovedAway).
package nodemove
