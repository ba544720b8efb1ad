# spade: domain=tool_use skill=data-retrieval
"""Public library desk: find the exact catalogue record among look-alike editions, formats and
authors, then place holds, renew a loan once and settle a fine for the member."""

import json

WORKS = [
    ("The Salt Road", "Ines Varga", "history"), ("Night Garden", "Paul Mercer", "fiction"),
    ("Small Engines", "Dana Cole", "technology"), ("The Quiet Sea", "Ana Ruiz", "fiction"),
    ("Counting Stars", "Lee Okoro", "science"), ("Iron and Ash", "Mira Stone", "history"),
    ("Field Notes", "Jon Aalto", "science"), ("Paper Bridges", "Rosa Lind", "fiction"),
    ("The Long Winter", "Emil Brandt", "history"), ("Circuits", "Yara Haddad", "technology"),
]
FORMATS = ["hardcover", "paperback", "ebook", "audiobook"]
OTHER_AUTHORS = ["Tom Hale", "Sara Quist", "Ben Ito", "Lena Marsh"]


class LibraryLoansEnv(ToolUseBaseEnv):
    max_turns = 14

    def setup(self):
        rng = self.rng
        ids = iter(rng.sample(range(10000, 99999), 40))
        books = {}

        def add(title, author, subject, year, fmt, available):
            bid = f"BK-{next(ids)}"
            books[bid] = {"title": title, "author": author, "subject": subject, "year": year,
                          "format": fmt, "available": available,
                          "isbn": "978" + "".join(str(rng.randint(0, 9)) for _ in range(10))}
            return bid

        works = rng.sample(WORKS, 6)
        title, author, subject = works[0]
        years = sorted(rng.sample(range(1995, 2024), 3))
        want_year = rng.choice(years)
        want_fmt = rng.choice(FORMATS[:3])
        target = None
        for year in years:
            for fmt in rng.sample(FORMATS, 2 if year != want_year else 3):
                if year == want_year and fmt == want_fmt:
                    continue
                add(title, author, subject, year, fmt, rng.random() < 0.5)
            if year == want_year:
                target = add(title, author, subject, year, want_fmt, False)
        add(title, rng.choice(OTHER_AUTHORS), rng.choice(["fiction", "history"]), want_year,
            want_fmt, True)
        # the member's current loan
        loan_title, loan_author, loan_subject = works[1]
        loan_book = add(loan_title, loan_author, loan_subject, rng.randint(1990, 2022),
                        "paperback", False)
        # the "available now" request: one author with several books, one available in subject
        other_title, author2, subject2 = works[2]
        available = add(other_title, author2, subject2, rng.randint(2000, 2023), "hardcover", True)
        add(other_title, author2, subject2, rng.randint(2000, 2023), "ebook", False)
        for w in works[3:]:
            add(w[0], author2 if rng.random() < 0.5 else w[1], w[2], rng.randint(1990, 2023),
                rng.choice(FORMATS), False)
            add(w[0], w[1], w[2], rng.randint(1990, 2023), rng.choice(FORMATS), rng.random() < 0.5)
        card = "".join(str(rng.randint(0, 9)) for _ in range(8))
        member = f"M-{rng.randint(100, 999)}"
        loan_id = f"L-{rng.randint(1000, 9999)}"
        fine = rng.randint(1, 12) * 50 + rng.choice([0, 25])
        due = rng.randint(3, 20)
        self.state = {
            "books": books,
            "members": {member: {"card": card, "fine_cents": fine, "holds": []},
                        f"M-{rng.randint(1000, 1999)}": {"card": card[::-1] + "1",
                                                         "fine_cents": 0, "holds": []}},
            "loans": {loan_id: {"member": member, "book": loan_book, "due_day": due,
                                "renewals": 0}},
        }
        self.instructions = [
            f"My library card number is {card}. Please place a hold for me on the {want_year} "
            f"{want_fmt} edition of '{title}' by {author}.",
            f"I have '{loan_title}' on loan right now. Please renew that loan once.",
            f"Also pay off the whole fine on my account (${fine / 100:.2f}).",
            f"Finally, put a hold on a {subject2} book by {author2} that is available right now.",
        ]
        self.criteria = [
            lambda s: target in s["members"][member]["holds"],
            lambda s: s["loans"][loan_id]["renewals"] == 1,
            lambda s: s["members"][member]["fine_cents"] == 0,
            lambda s: available in s["members"][member]["holds"],
        ]
        self._plan = [
            ("find_member", {"card_number": card}),
            ("search_catalog", {"query": title, "field": "title"}),
            ("place_hold", {"member_id": member, "book_id": target}),
            ("get_loans", {"member_id": member}),
            ("renew_loan", {"loan_id": loan_id}),
            ("pay_fine", {"member_id": member, "amount": fine / 100}),
            ("search_catalog", {"query": author2, "field": "author"}),
            ("get_book", {"book_id": available}),
            ("place_hold", {"member_id": member, "book_id": available}),
        ]
        self.tools = {
            "find_member": {
                "description": "Look up a member by library card number; returns the member id "
                               "and outstanding fine.",
                "parameters": {"type": "object",
                               "properties": {"card_number": {"type": "string"}},
                               "required": ["card_number"]}},
            "search_catalog": {
                "description": "Search the catalogue. Returns book ids with title, author, year "
                               "and format (not availability).",
                "parameters": {"type": "object", "properties": {
                    "query": {"type": "string"},
                    "field": {"type": "string", "enum": ["title", "author", "subject", "isbn"]}},
                    "required": ["query", "field"]}},
            "get_book": {
                "description": "Full record of one book, including whether a copy is on the "
                               "shelf now.",
                "parameters": {"type": "object", "properties": {"book_id": {"type": "string"}},
                               "required": ["book_id"]}},
            "place_hold": {
                "description": "Place a hold on a book for a member (at most 5 holds).",
                "parameters": {"type": "object", "properties": {
                    "member_id": {"type": "string"}, "book_id": {"type": "string"}},
                    "required": ["member_id", "book_id"]}},
            "get_loans": {
                "description": "List a member's current loans with due dates and renewal counts.",
                "parameters": {"type": "object", "properties": {"member_id": {"type": "string"}},
                               "required": ["member_id"]}},
            "renew_loan": {
                "description": "Renew a loan for 14 more days (at most 2 renewals per loan).",
                "parameters": {"type": "object", "properties": {"loan_id": {"type": "string"}},
                               "required": ["loan_id"]}},
            "pay_fine": {
                "description": "Pay some or all of a member's outstanding fine, in dollars.",
                "parameters": {"type": "object", "properties": {
                    "member_id": {"type": "string"}, "amount": {"type": "number"}},
                    "required": ["member_id", "amount"]}},
            "get_branch_hours": {
                "description": "Opening hours of a library branch.",
                "parameters": {"type": "object", "properties": {
                    "branch": {"type": "string", "enum": ["central", "harbour", "hillside"]}},
                    "required": ["branch"]}},
        }

    # -- helpers ------------------------------------------------------------------------------
    def _member(self, member_id):
        m = self.state["members"].get(str(member_id))
        if m is None:
            raise ValueError(f"unknown member id '{member_id}'. Use find_member first.")
        return m

    def _row(self, bid):
        b = self.state["books"][bid]
        return {"book_id": bid, "title": b["title"], "author": b["author"], "year": b["year"],
                "format": b["format"]}

    # -- tools --------------------------------------------------------------------------------
    def tool_find_member(self, card_number):
        for mid, m in sorted(self.state["members"].items()):
            if m["card"] == str(card_number).strip():
                return json.dumps({"member_id": mid, "fine": f"${m['fine_cents'] / 100:.2f}",
                                   "holds": list(m["holds"])})
        return "Error: no member with that card number."

    def tool_search_catalog(self, query, field):
        if field not in ("title", "author", "subject", "isbn"):
            return "Error: field must be title, author, subject or isbn."
        q = str(query).strip().lower()
        if not q:
            return "Error: empty query."
        rows = [self._row(bid) for bid, b in sorted(self.state["books"].items())
                if q in str(b[field]).lower()]
        return json.dumps(rows) if rows else "No results."

    def tool_get_book(self, book_id):
        b = self.state["books"].get(str(book_id))
        if b is None:
            return f"Error: no book '{book_id}'."
        return json.dumps({**self._row(book_id), "subject": b["subject"], "isbn": b["isbn"],
                           "on_shelf_now": b["available"]})

    def tool_place_hold(self, member_id, book_id):
        m = self._member(member_id)
        if str(book_id) not in self.state["books"]:
            return f"Error: no book '{book_id}'."
        if book_id in m["holds"]:
            return "Error: this member already holds that book."
        if len(m["holds"]) >= 5:
            return "Error: the member already has 5 holds."
        m["holds"].append(book_id)
        return f"Hold placed on {book_id} ({self.state['books'][book_id]['title']})."

    def tool_get_loans(self, member_id):
        self._member(member_id)
        rows = [{"loan_id": lid, "book_id": l["book"],
                 "title": self.state["books"][l["book"]]["title"],
                 "due_in_days": l["due_day"], "renewals": l["renewals"]}
                for lid, l in sorted(self.state["loans"].items()) if l["member"] == member_id]
        return json.dumps(rows) if rows else "No current loans."

    def tool_renew_loan(self, loan_id):
        loan = self.state["loans"].get(str(loan_id))
        if loan is None:
            return f"Error: no loan '{loan_id}'."
        if loan["renewals"] >= 2:
            return "Error: this loan has already been renewed twice."
        loan["renewals"] += 1
        loan["due_day"] += 14
        return f"Loan {loan_id} renewed; now due in {loan['due_day']} days."

    def tool_pay_fine(self, member_id, amount):
        m = self._member(member_id)
        if isinstance(amount, bool) or not isinstance(amount, (int, float)):
            return "Error: amount must be a number of dollars."
        cents = round(amount * 100)
        if cents <= 0:
            return "Error: amount must be positive."
        if m["fine_cents"] == 0:
            return "Error: there is no outstanding fine."
        if cents > m["fine_cents"]:
            return f"Error: that is more than the outstanding ${m['fine_cents'] / 100:.2f}."
        m["fine_cents"] -= cents
        return f"Paid ${cents / 100:.2f}; ${m['fine_cents'] / 100:.2f} still outstanding."

    def tool_get_branch_hours(self, branch):
        hours = {"central": "09:00-20:00", "harbour": "10:00-18:00", "hillside": "12:00-19:00"}
        if branch not in hours:
            return "Error: unknown branch."
        return f"{branch}: {hours[branch]}"

    def solution(self):
        return [f"<tool_call>{json.dumps({'name': n, 'arguments': a})}</tool_call>"
                for n, a in self._plan] + ["<answer>done</answer>"]
