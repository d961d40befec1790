"""Signing in and out in a real browser: the form, the home page, the role's navigation, and a page
that loads htmx with no Content Security Policy complaint."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect

from tests.browser.conftest import PASSWORD


def test_the_sign_in_page_renders_with_htmx_and_no_console_errors(new_page, console):
    page = new_page()
    page.goto("/")
    expect(page).to_have_url(re.compile(r"/login"))  # signed out: sent to sign in
    expect(page.get_by_role("heading", name="Sign in")).to_be_visible()
    expect(page.get_by_label("Email")).to_be_focused()
    expect(page.get_by_label("Password")).to_have_attribute("type", "password")
    assert page.evaluate("typeof htmx") == "object"
    assert console.errors() == []


def test_a_wrong_password_is_refused_in_words(new_page, console):
    page = new_page()
    page.goto("/login")
    page.get_by_label("Email").fill("agent@acme.test")
    page.get_by_label("Password").fill("not-the-password")
    page.get_by_role("button", name="Sign in").click()
    expect(page.get_by_text("Email or password is wrong.")).to_be_visible()
    expect(page).to_have_url(re.compile(r"/login$"))
    expect(page.get_by_role("button", name="Sign out")).to_have_count(0)
    # Chromium logs the page's own 401 (the answer to a failed sign-in, on purpose), and nothing else.
    assert all("status of 401" in error for error in console.errors()), console.errors()


def test_the_right_password_lands_on_the_home_page_with_name_and_tenant(page_for, console):
    page = page_for("agent@acme.test")
    expect(page.get_by_role("heading", name="Hello, Acme Corp agent")).to_be_visible()
    expect(page.get_by_role("banner")).to_contain_text("Acme Corp agent · Acme Corp")
    assert page.evaluate("typeof htmx") == "object"
    assert console.errors() == []


def test_the_navigation_shows_only_the_links_of_the_role(page_for):
    main_nav = {
        email: page_for(email).get_by_role("navigation", name="Main")
        for email in ("agent@acme.test", "admin@acme.test")
    }
    agent, admin = main_nav["agent@acme.test"], main_nav["admin@acme.test"]
    expect(agent.get_by_role("link", name="Conversations")).to_be_visible()
    for hidden in ("Users", "Approvals", "Audit log"):
        expect(agent.get_by_role("link", name=hidden)).to_have_count(0)
    expect(admin.get_by_role("link", name="Users")).to_be_visible()
    expect(admin.get_by_role("link", name="Conversations")).to_be_visible()
    expect(admin.get_by_role("link", name="Approvals")).to_have_count(0)


def test_signing_out_ends_the_session(page_for, console):
    page = page_for("reviewer@acme.test")
    page.get_by_role("button", name="Sign out").click()
    # A live part of the page (the badge) may ask the server while the sign-out lands, and be sent to
    # sign in too: then back to the page it sat on, never to the fragment's own address.
    expect(page).to_have_url(re.compile(r"/login(\?next=%2F[^&]*)?$"))
    assert "badge" not in page.url
    expect(page.get_by_text("You are signed out.")).to_be_visible()
    page.goto("/")
    expect(page).to_have_url(re.compile(r"/login"))
    expect(page.get_by_role("heading", name="Sign in")).to_be_visible()
    assert console.errors() == []


def test_the_content_security_policy_is_enforced_and_its_violations_are_seen(new_page, console):
    """The "no CSP violation" checks above mean something: an inline script is refused, and said so."""
    page = new_page()
    page.goto("/login")
    with page.expect_console_message(lambda message: "Content Security Policy" in message.text) as refused:
        page.evaluate(
            """() => {
                const script = document.createElement("script");
                script.textContent = "window.inlineScriptRan = true";
                document.head.append(script);
            }"""
        )
    assert "inline script" in refused.value.text
    assert page.evaluate("window.inlineScriptRan") is None
    assert console.csp_violations()
    console.clear()


@pytest.mark.parametrize(
    "sent, lands_on",
    [
        ("%2F%09%2Fevil.test%2Fx", "/"),  # a browser drops the tab: "//evil.test/x", another site
        ("%2F%0D%0A%2Fevil.test%2Fx", "/"),  # a newline: the same, or a broken header
        ("%2Fx%0D%0ASet-Cookie%3A%20a%3Db", "/"),
        ("%2F%5C%2Fevil.test", "/"),  # "/\/evil.test": a backslash reads as a slash
        ("https%3A%2F%2Fevil.test%2F", "/"),
        ("%2Fapprovals%3Ftool%3Dissue_refund", "/approvals?tool=issue_refund"),  # a path of ours is kept
    ],
)
def test_signing_in_returns_only_to_a_path_of_this_site(new_page, live_server, sent, lands_on):
    page = new_page()
    page.goto(f"/login?next={sent}")
    page.get_by_label("Email").fill("reviewer@acme.test")
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_load_state()
    assert page.url == live_server.url + lands_on
    expect(page.get_by_role("button", name="Sign out")).to_be_visible()


def test_a_rate_limited_sign_in_keeps_its_form_and_says_when_to_try_again(new_page, console):
    page = new_page()
    page.goto("/login")
    for _ in range(5):  # the account's limit: five failed sign-ins in 15 minutes
        page.get_by_label("Email").fill("agent@acme.test")
        page.get_by_label("Password").fill("not-the-password")
        page.get_by_role("button", name="Sign in").click()
        expect(page.get_by_text("Email or password is wrong.")).to_be_visible()
    page.get_by_label("Password").fill(PASSWORD)  # even the right one, while the account is locked
    page.get_by_role("button", name="Sign in").click()

    blocked = page.locator("#sign-in-blocked")
    expect(blocked).to_contain_text("Too many failed sign-ins for this account; an admin can unlock it sooner.")
    expect(blocked).to_contain_text(re.compile(r"Try again after \d\d:\d\d UTC \(in 1[45] minutes\)\."))
    expect(page.get_by_label("Email")).to_have_value("agent@acme.test")  # the form, with the e-mail kept
    expect(page.get_by_label("Password")).to_have_value("")
    expect(page.get_by_role("button", name="Sign in")).to_be_visible()
    expect(page.get_by_role("button", name="Sign out")).to_have_count(0)
    # Chromium logs the page's own 401s and 429 (answers on purpose), and nothing else.
    assert all(re.search(r"status of (401|429)", error) for error in console.errors()), console.errors()
