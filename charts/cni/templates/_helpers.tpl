{{- /* Whether namespaced / cluster-scoped objects are rendered (global.resourceScope). */ -}}
{{- define "cni.namespaced" -}}
{{- if has .Values.global.resourceScope (list "all" "namespace") }}true{{ end }}
{{- end }}
{{- define "cni.cluster" -}}
{{- if has .Values.global.resourceScope (list "all" "cluster") }}true{{ end }}
{{- end }}

{{- /* The host's CNI plugin directory: the value, else /opt/cni/bin (GKE: /home/kubernetes/bin). */ -}}
{{- define "cni.binDir" -}}
{{- if .Values.cniBinDir }}{{ .Values.cniBinDir }}
{{- else if contains "-gke" .Capabilities.KubeVersion.GitVersion }}/home/kubernetes/bin
{{- else }}/opt/cni/bin
{{- end }}
{{- end }}

{{- /* Labels of the chart's configuration objects. */ -}}
{{- define "cni.labels" -}}
app: istio-cni
release: {{ .Release.Name }}
istio.io/rev: {{ .Values.revision | default "default" | quote }}
install.operator.istio.io/owning-resource: {{ .Values.ownerName | default "unknown" }}
operator.istio.io/component: "Cni"
app.kubernetes.io/name: istio-cni
{{ include "istio.labels" . }}
{{- end }}
