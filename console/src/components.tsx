import { useEffect, useRef, useState } from "preact/hooks"
import type { Refusal } from "./api"
import { type CredentialKind, credentialNames, setCredential } from "./credentials"

/** Asks for a secret; it is kept for the tab's session (sessionStorage) and `onSaved` retries. */
export const CredentialForm = ({ kind, onSaved }: { readonly kind: CredentialKind; readonly onSaved?: () => void }) => {
  const [value, setValue] = useState("")
  const save = (event: Event) => {
    event.preventDefault()
    if (value.trim() === "") return
    setCredential(kind, value)
    setValue("")
    onSaved?.()
  }
  return (
    <form class="credential" data-kind={kind} onSubmit={save}>
      <label>
        {kind === "admin" ? "Admin token" : kind === "apiKey" ? "API key" : "Metrics or admin token"}
        <input
          type="password"
          autocomplete="off"
          value={value}
          placeholder={credentialNames[kind]}
          onInput={(event) => setValue(event.currentTarget.value)}
        />
      </label>
      <button type="submit">Use {kind === "apiKey" ? "key" : "token"}</button>
    </form>
  )
}

/** A refused request: the gateway's status, code and message; on a 401, the form for the secret it wants. */
export const RefusalNotice = ({ refusal, onRetry }: { readonly refusal: Refusal; readonly onRetry?: () => void }) => (
  <div class="refusal" role="alert">
    <p>
      <strong>
        {refusal.status === 0 ? "Failed" : `Refused (${refusal.status})`} {refusal.code}
      </strong>
      : {refusal.message}
    </p>
    {refusal.status === 401 && refusal.needs !== undefined && (
      <CredentialForm kind={refusal.needs} {...(onRetry === undefined ? {} : { onSaved: onRetry })} />
    )}
  </div>
)

/**
 * Runs `poll` now and then every `intervalMs` after each run ends (never two at once), until the
 * component goes or `key` changes.
 */
export const usePolling = (poll: (signal: AbortSignal) => Promise<void>, intervalMs: number, key: unknown = 0) => {
  const latest = useRef(poll)
  latest.current = poll
  useEffect(() => {
    const abort = new AbortController()
    let timer: ReturnType<typeof setTimeout> | undefined
    const run = async () => {
      await latest.current(abort.signal).catch(() => undefined)
      if (!abort.signal.aborted) timer = setTimeout(run, intervalMs)
    }
    void run()
    return () => {
      abort.abort()
      clearTimeout(timer)
    }
  }, [intervalMs, key])
}

/** A text cut to `chars`, saying how long it was: an app's answer may hold megabytes in one field. */
export const clipped = (text: string, chars = 300) =>
  text.length > chars ? `${text.slice(0, chars)}… (${text.length.toLocaleString()} characters)` : text

export const formatMs = (ms: number) =>
  ms >= 1000 ? `${(ms / 1000).toFixed(ms >= 10_000 ? 0 : 1)} s` : `${ms.toFixed(ms >= 10 ? 0 : 1)} ms`
