{{- /* The DaemonSet's and ServiceAccount's name. */ -}}
{{- define "ztunnel.release-name" -}}
{{- .Values.resourceName | default "ztunnel" }}
{{- end }}

{{- /* istiod's address as ztunnel dials it. */ -}}
{{- define "ztunnel.istiod" -}}
istiod{{ with .Values.revision }}-{{ . }}{{ end }}.{{ .Values.istioNamespace }}.svc:15012
{{- end }}

{{- /* Whether namespaced / cluster-scoped objects are rendered (resourceScope). */ -}}
{{- define "ztunnel.namespaced" -}}
{{- if has .Values.resourceScope (list "all" "namespace") }}true{{ end }}
{{- end }}


{{- /* Annotations of every object: the user's, and the revision. */ -}}
{{- define "ztunnel.annotations" -}}
{{- $annotations := deepCopy (.Values.annotations | default dict) }}
{{- with .Values.revision }}
{{- $_ := set $annotations "istio.io/rev" . }}
{{- end }}
{{- with $annotations }}
annotations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}
