/**
 * The web console: the platform's apps, tasks, nodes and metrics, and a playground for every app,
 * all through the gateway's own routes. Pages are hash routes (`#/apps`, `#/tasks`, `#/metrics`,
 * `#/play/ID`), so the gateway serves one page and its assets.
 */
import { render } from "preact"
import { useEffect, useState } from "preact/hooks"
import { CredentialForm } from "./components"
import { type CredentialKind, credential, onCredentialsChange, setCredential } from "./credentials"
import { AppsPage } from "./pages/Apps"
import { MetricsPage } from "./pages/Metrics"
import { PlaygroundPage } from "./pages/Playground"
import { TasksPage } from "./pages/Tasks"
import "./style.css"

type Route =
  | { readonly page: "apps" }
  | { readonly page: "tasks" }
  | { readonly page: "metrics" }
  | { readonly page: "play"; readonly appId: string }

const routeOf = (hash: string): Route => {
  const [page, ...rest] = hash.replace(/^#\/?/, "").split("/")
  switch (page) {
    case "tasks":
      return { page: "tasks" }
    case "metrics":
      return { page: "metrics" }
    case "play": {
      let appId = ""
      try {
        appId = decodeURIComponent(rest.join("/"))
      } catch {}
      return { page: "play", appId }
    }
    default:
      return { page: "apps" }
  }
}

const useRoute = () => {
  const [route, setRoute] = useState(() => routeOf(location.hash))
  useEffect(() => {
    const changed = () => setRoute(routeOf(location.hash))
    addEventListener("hashchange", changed)
    return () => removeEventListener("hashchange", changed)
  }, [])
  return route
}

/** Which secrets the tab holds, to forget them, or to give the admin token before a route asks. */
const Credentials = () => {
  const [, setVersion] = useState(0)
  const [asking, setAsking] = useState(false)
  useEffect(() => onCredentialsChange(() => setVersion((value) => value + 1)), [])
  const held = (["admin", "apiKey", "metrics"] as const).filter((kind) => credential(kind) !== undefined)
  const names: Record<CredentialKind, string> = { admin: "admin token", apiKey: "API key", metrics: "metrics token" }
  return (
    <div class="credentials">
      {held.map((kind) => (
        <span key={kind} class="held" data-kind={kind}>
          {names[kind]} ✓{" "}
          <button type="button" class="link" onClick={() => setCredential(kind, undefined)}>
            forget
          </button>
        </span>
      ))}
      {credential("admin") === undefined &&
        (asking ? (
          <CredentialForm kind="admin" onSaved={() => setAsking(false)} />
        ) : (
          <button type="button" class="link" onClick={() => setAsking(true)}>
            Admin token…
          </button>
        ))}
    </div>
  )
}

const pages = [
  ["apps", "Apps"],
  ["tasks", "Tasks & nodes"],
  ["metrics", "Metrics"],
  ["play", "Playground"]
] as const

const Console = () => {
  const route = useRoute()
  return (
    <>
      <header>
        <h1>
          <img src="/console/favicon.svg" alt="" width="22" height="22" /> Cornserve
        </h1>
        <nav>
          {pages.map(([page, title]) => (
            <a key={page} href={`#/${page}`} class={route.page === page ? "active" : ""} data-page={page}>
              {title}
            </a>
          ))}
          <a href="/docs">API docs</a>
        </nav>
        <Credentials />
      </header>
      <main>
        {route.page === "apps" && <AppsPage />}
        {route.page === "tasks" && <TasksPage />}
        {route.page === "metrics" && <MetricsPage />}
        {route.page === "play" && <PlaygroundPage appId={route.appId} />}
      </main>
    </>
  )
}

render(<Console />, document.getElementById("console")!)
