/**
 * The secrets the console sends: the admin token (admin routes), an API key (apps' routes, when the
 * platform or an app has keys) and the metrics token (/metrics). Kept in sessionStorage only, for the
 * browser tab's life, as the /docs page keeps its key; never in localStorage or a cookie.
 */
export type CredentialKind = "admin" | "apiKey" | "metrics"

/** The /docs page's name for the API key: a key given on either page serves both. */
const storageKeys: Readonly<Record<CredentialKind, string>> = {
  admin: "cornserve-admin-token",
  apiKey: "cornserve-api-key",
  metrics: "cornserve-metrics-token"
}

const listeners = new Set<() => void>()

export const credential = (kind: CredentialKind): string | undefined => {
  const value = sessionStorage.getItem(storageKeys[kind])
  return value === null || value === "" ? undefined : value
}

export const setCredential = (kind: CredentialKind, value: string | undefined) => {
  if (value === undefined || value.trim() === "") sessionStorage.removeItem(storageKeys[kind])
  else sessionStorage.setItem(storageKeys[kind], value.trim())
  for (const listener of listeners) listener()
}

export const onCredentialsChange = (listener: () => void) => {
  listeners.add(listener)
  return () => {
    listeners.delete(listener)
  }
}

/**
 * The bearer a route of `kind` is sent: its own secret, else the admin token, which every route takes
 * (the platform counts it among the API keys and the metrics readers).
 */
export const bearerFor = (kind: CredentialKind | "none"): string | undefined =>
  kind === "none" ? undefined : (credential(kind) ?? credential("admin"))

export const credentialNames: Readonly<Record<CredentialKind, string>> = {
  admin: "admin token",
  apiKey: "API key",
  metrics: "metrics token (or the admin token)"
}
