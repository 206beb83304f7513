package contract

// Metric names the daemons export and the doctor reads.
const (
	MetricRegistrations   = "nvinject_device_plugin_registrations_total"
	MetricAllocations     = "nvinject_device_plugin_allocations_total"
	MetricStreams         = "nvinject_device_plugin_list_and_watch_streams"
	MetricHealthEvents    = "nvinject_device_plugin_health_events_total"
	MetricDeviceHealthy   = "nvinject_device_plugin_device_healthy"
	MetricHealthCoalesced = "nvinject_device_plugin_health_updates_coalesced_total"
	MetricRepublishes     = "nvinject_device_plugin_republishes_total"
	MetricLabelApplies    = "nvinject_device_plugin_node_label_applies_total"
	MetricNRIInjections   = "nvinject_nri_injections_total"
	MetricNRIRefusals     = "nvinject_nri_refusals_total"
	MetricNRICreate       = "nvinject_nri_create_container_seconds"
	MetricNRIConnected    = "nvinject_nri_connected"
	MetricNRIRunningGPUs  = "nvinject_nri_running_gpu_containers"
)

// MetricGPUHeld is 1 per GPU the device plugin publishes Unhealthy because
// another path holds it: label holder is HeldByDRAClaim (with pod and
// claim) or HeldUnknown (PodResources unreadable: every GPU).
const MetricGPUHeld = "nvinject_device_plugin_gpu_held"

// Values of MetricGPUHeld's holder label.
const (
	HeldByDRAClaim = "dra-claim"
	HeldUnknown    = "unknown"
)
