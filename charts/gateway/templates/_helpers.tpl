{{- /* The gateway's name: .Values.name, else the release's, else istio-ingressgateway. */ -}}
{{- define "gateway.name" -}}
{{- .Values.name | default .Release.Name | default "istio-ingressgateway" }}
{{- end }}

{{- /* The pods' selector labels: app and istio (the name without its istio- prefix). */ -}}
{{- define "gateway.selectorLabels" -}}
app: {{ include "gateway.name" . }}
istio: {{ include "gateway.name" . | trimPrefix "istio-" }}
{{- end }}

{{- /* Labels of every object. */ -}}
{{- define "gateway.labels" -}}
{{ include "gateway.selectorLabels" . }}
{{ include "istio.labels" . }}
{{- with .Values.revision }}
istio.io/rev: {{ . }}
{{- end }}
{{- with .Values.networkGateway }}
topology.istio.io/network: {{ . }}
{{- end }}
{{- with .Values.labels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{- define "gateway.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- .Values.serviceAccount.name | default (include "gateway.name" .) }}
{{- else }}
{{- .Values.serviceAccount.name | default "default" }}
{{- end }}
{{- end }}

{{- /* Annotations of every object. */ -}}
{{- define "gateway.annotations" -}}
{{- with .Values.annotations }}
annotations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}
