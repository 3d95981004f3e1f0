{{/* Labels shared by every object of the release. */}}
{{- define "egressd.labels" -}}
app.kubernetes.io/name: {{ .Values.workload.name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ .Chart.Name }}-{{ .Chart.Version }}
{{- end -}}

{{/* The pod's selector labels. */}}
{{- define "egressd.selector" -}}
app.kubernetes.io/name: {{ .Values.workload.name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* The projected token for Vault's kubernetes and jwt auth. */}}
{{- define "egressd.vaultTokenAuth" -}}
{{- $m := .Values.credentials.vault.auth.method -}}
{{- and (eq .Values.credentials.backend "vault") (or (eq $m "kubernetes") (eq $m "jwt")) -}}
{{- end -}}

{{/* Values the chart refuses: each would break what the pod promises. */}}
{{- define "egressd.validate" -}}
{{- $v := .Values -}}
{{- if not (has $v.credentials.backend (list "vault" "file")) -}}
{{- fail (printf "credentials.backend %q: want vault or file" $v.credentials.backend) -}}
{{- end -}}
{{- if not (has $v.credentials.vault.auth.method (list "kubernetes" "jwt" "approle" "token")) -}}
{{- fail (printf "credentials.vault.auth.method %q: want kubernetes, jwt, approle or token" $v.credentials.vault.auth.method) -}}
{{- end -}}
{{- if eq (int $v.uid) (int $v.istio.proxyUID) -}}
{{- fail (printf "uid %v is Istio's istio-proxy uid: its traffic would bypass the mesh, and the mesh's would bypass egressd" $v.uid) -}}
{{- end -}}
{{- range $name, $p := $v.ports -}}
{{- if and (ge (int $p) 15000) (le (int $p) 15090) -}}
{{- fail (printf "ports.%s %v is in Istio's reserved 15000-15090" $name $p) -}}
{{- end -}}
{{- end -}}
{{- range $v.workload.containers -}}
{{- $u := int (dig "securityContext" "runAsUser" 0 .) -}}
{{- if or (eq $u 0) (eq $u (int $v.uid)) (eq $u (int $v.istio.proxyUID)) -}}
{{- fail (printf "container %s: runAsUser must be set and be neither 0, egressd's %v nor Istio's %v (those bypass the redirect)" .name $v.uid $v.istio.proxyUID) -}}
{{- end -}}
{{- if not (and (dig "resources" "requests" "cpu" "" .) (dig "resources" "requests" "memory" "" .)) -}}
{{- fail (printf "container %s: resources.requests needs cpu and memory (a namespace with a ResourceQuota rejects the pod otherwise)" .name) -}}
{{- end -}}
{{- end -}}
{{- end -}}
