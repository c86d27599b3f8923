// The API key lives in session storage: it survives reloads in this tab and is gone when the tab closes.

const KEY = "quant.apiKey";

export function apiKey(): string | null {
  return sessionStorage.getItem(KEY);
}

export function signIn(key: string): void {
  sessionStorage.setItem(KEY, key);
}

export function signOut(): void {
  sessionStorage.removeItem(KEY);
}
