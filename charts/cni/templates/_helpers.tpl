{{- /* <hub>/<image>:<tag>[-<variant>] (hub, tag, variant falling back to global.*). */ -}}
{{- define "cni.image" -}}
{{- if contains "/" .Values.image -}}
{{ .Values.image }}
{{- else -}}
{{ .Values.hub | default .Values.global.hub }}/{{ .Values.image | default "install-cni" }}:{{ .Values.tag | default .Values.global.tag }}{{ with (.Values.variant | default .Values.global.variant) }}-{{ . }}{{ end }}
{{- end }}
{{- end }}

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

{{- /* Resource requests and limits without empty entries. */ -}}
{{- define "cni.resources" -}}
{{- with .limits }}
limits:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .requests }}
requests:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}
