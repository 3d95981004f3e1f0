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

{{/* The directory egressd writes its CA's public files into (tls.ca_public_dir):
a subdirectory of the egressd-ca-public emptyDir, since egressd makes it 0755 and
cannot chmod the volume's root. */}}
{{- define "egressd.caPublicMount" -}}/var/run/egressd-ca{{- end -}}
{{- define "egressd.caPublicDir" -}}{{ include "egressd.caPublicMount" . }}/ca{{- end -}}

{{/* egressd.workloadContainers: the workload's containers, each trusting egressd's
CA as `egressd ca env` sets it up on a host (the merged bundle for the clients that
replace their roots, the CA alone for Node, the Java trust store), from the
egressd-ca-public volume mounted read-only. A container's own env comes after, so
it can override one. */}}
{{- define "egressd.workloadContainers" -}}
{{- $dir := include "egressd.caPublicDir" . -}}
{{- $bundle := printf "%s/ca-bundle.pem" $dir -}}
{{- $trust := list -}}
{{- range list "SSL_CERT_FILE" "REQUESTS_CA_BUNDLE" "CURL_CA_BUNDLE" "GIT_SSL_CAINFO" "CARGO_HTTP_CAINFO" "PIP_CERT" "DENO_CERT" -}}
{{- $trust = append $trust (dict "name" . "value" $bundle) -}}
{{- end -}}
{{- $trust = append $trust (dict "name" "NODE_EXTRA_CA_CERTS" "value" (printf "%s/ca.pem" $dir)) -}}
{{- $trust = append $trust (dict "name" "JAVA_TOOL_OPTIONS" "value" (printf "-Djavax.net.ssl.trustStore=%s/ca-truststore.p12 -Djavax.net.ssl.trustStoreType=PKCS12 -Djavax.net.ssl.trustStorePassword=egressd-public" $dir)) -}}
{{- $mount := dict "name" "egressd-ca-public" "mountPath" (include "egressd.caPublicMount" .) "readOnly" true -}}
{{- $out := list -}}
{{- range .Values.workload.containers -}}
{{- $c := deepCopy . -}}
{{- $_ := set $c "env" (concat $trust (default list .env)) -}}
{{- $_ := set $c "volumeMounts" (append (default list .volumeMounts) $mount) -}}
{{- $out = append $out $c -}}
{{- end -}}
{{- toYaml $out -}}
{{- end -}}
