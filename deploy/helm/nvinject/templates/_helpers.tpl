{{- define "nvinject.labels" -}}
app.kubernetes.io/part-of: nvinject
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ .Chart.Name }}-{{ .Chart.Version }}
{{- end -}}

{{- define "nvinject.sim" -}}
{{- if hasPrefix "sim:" .Values.nvml }}true{{ end -}}
{{- end -}}

{{- define "nvinject.probes" -}}
livenessProbe:
  httpGet:
    path: /healthz
    port: metrics
  initialDelaySeconds: 5
  periodSeconds: 10
  failureThreshold: 3
readinessProbe:
  httpGet:
    path: /readyz
    port: metrics
  periodSeconds: 5
  failureThreshold: 3
{{- end -}}

{{- /* Takes a bool: privileged (the device plugin on CDI-only nodes, nvinject-dra making MIG devices). */ -}}
{{- define "nvinject.securityContext" -}}
securityContext:
  privileged: {{ . }}
  allowPrivilegeEscalation: {{ . }}
  readOnlyRootFilesystem: true
  runAsUser: 0
  runAsGroup: 0
  runAsNonRoot: false
  capabilities:
    drop:
      - ALL
{{- end -}}

{{- /* Takes the root context, or a dict of its Values and the serviceAccount
the pod's token is for (nvinject-nri's audit Events); without one, no token. */ -}}
{{- define "nvinject.podScheduling" -}}
priorityClassName: {{ .Values.priorityClassName }}
{{- with .serviceAccount }}
serviceAccountName: {{ . }}
automountServiceAccountToken: true
{{- else }}
automountServiceAccountToken: false
{{- end }}
enableServiceLinks: false
{{- with .Values.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
securityContext:
  seccompProfile:
    type: RuntimeDefault
{{- end -}}

{{- /* kubelet's directories: the value, or derived from kubelet.rootDir as kubelet derives it. */ -}}
{{- define "nvinject.kubeletSubdir" -}}
{{- $k := index . 0 -}}
{{- index $k (index . 1) | default (printf "%s/%s" (trimSuffix "/" $k.rootDir) (index . 2)) -}}
{{- end -}}
{{- define "nvinject.podResourcesDir" -}}
{{- include "nvinject.kubeletSubdir" (list .Values.kubelet "podResourcesDir" "pod-resources") -}}
{{- end -}}
{{- define "nvinject.pluginsRegistryDir" -}}
{{- include "nvinject.kubeletSubdir" (list .Values.kubelet "pluginsRegistryDir" "plugins_registry") -}}
{{- end -}}
{{- define "nvinject.pluginsDir" -}}
{{- include "nvinject.kubeletSubdir" (list .Values.kubelet "pluginsDir" "plugins") -}}
{{- end -}}
